package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/controller/scenario"
	"github.com/tessera-gpu/tessera/internal/fairplot"
)

// TestPlotBurstyWeek: --plot draws the bursty week's two runs to the
// pictures the README shows, byte for byte (the drawing is deterministic;
// after a change, regenerate them with the command in the README), and
// the history run's picture differs from the weight-alone one.
func TestPlotBurstyWeek(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	out := filepath.Join(dir, "bursty-week.svg")
	if rc := runScenarios([]string{"../../controller/testdata/timed/bursty-week.yaml", "--plot", out}, &stdout, &stderr); rc != 0 {
		t.Fatalf("exit %d: %s%s", rc, stdout.String(), stderr.String())
	}
	var got [][]byte
	for _, name := range []string{"bursty-week-bursty-week-weight-alone.svg", "bursty-week-bursty-week-with-history.svg"} {
		if !strings.Contains(stderr.String(), "wrote "+filepath.Join(dir, name)) {
			t.Errorf("stderr does not name %s: %s", name, stderr.String())
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join("img", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, want) {
			t.Errorf("%s differs from img/%s: regenerate it (README, Fair over time)", name, name)
		}
		got = append(got, b)
	}
	if bytes.Equal(got[0], got[1]) {
		t.Error("the two runs drew the same picture")
	}
}

func TestPlotErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		// An untimed scenario has nothing over time to draw.
		{[]string{"../../controller/testdata/scenarios/actions.yaml", "--plot", "x.svg"}, "no timed scenario"},
		{[]string{"../../controller/testdata/timed/bursty-week.yaml", "--plot", "x.pdf"}, "want a .svg or .png file"},
	} {
		var stdout, stderr bytes.Buffer
		dir := t.TempDir()
		args := append([]string(nil), tc.args...)
		args[2] = filepath.Join(dir, args[2])
		if rc := runScenarios(args, &stdout, &stderr); rc != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", tc.args, rc, stderr.String(), tc.want)
		}
	}
}

// TestFairnessChartWindows: the samples in which a schedule window held
// (scheduled) become shaded windows, from the first such sample to the
// next one without; one still open at the end closes at the last sample.
func TestFairnessChartWindows(t *testing.T) {
	smp := func(h string, aSched, bSched bool) scenario.FairnessSample {
		return scenario.FairnessSample{Hour: json.Number(h), Queues: map[string]scenario.FairnessSampleQueue{
			"a": {GPUAllocated: "1", GPUFairShare: "1", GPUQuota: "2", Scheduled: aSched},
			"b": {GPUAllocated: "0", GPUFairShare: "1", GPUQuota: "0", Scheduled: bSched},
		}}
	}
	f := &scenario.FairnessReport{Queues: map[string]scenario.FairnessQueue{"a": {}, "b": {}},
		Samples: []scenario.FairnessSample{smp("1", false, false), smp("2", true, false), smp("3", true, false), smp("4", false, true), smp("5", false, true)}}
	c, err := fairnessChart(&scenario.Spec{Name: "w"}, f)
	if err != nil {
		t.Fatal(err)
	}
	want := []fairplot.Window{{Queue: "a", From: 2, To: 4}, {Queue: "b", From: 4, To: 5}}
	if !reflect.DeepEqual(c.Windows, want) {
		t.Errorf("windows %v, want %v", c.Windows, want)
	}
	if c.Queues[0].Name != "a" || !reflect.DeepEqual(c.Queues[0].Quota, []float64{2, 2, 2, 2, 2}) {
		t.Errorf("queue a: %+v", c.Queues[0])
	}
}
