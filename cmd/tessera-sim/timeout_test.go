package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A valid file that runs longer than --timeout stops with exit 2 and a
// message naming the file, the scenario, the limit and the cycle reached;
// the scenarios before it still print their reports (--json), and the run
// returns soon after the limit, not when the scenario would have ended.
func TestTimeoutExit2(t *testing.T) {
	dir := t.TempDir()
	quick := filepath.Join(dir, "quick.yaml")
	slow := filepath.Join(dir, "slow.yaml")
	// 10,000 cycles of 50 pods on one 8-GPU node: seconds at least (42 pods
	// stay pending and are tried for preemption every cycle), within
	// MaxWork (5·10⁵ pod-cycles × 1,001).
	for f, body := range map[string]string{
		quick: "name: quick\nnodes: [{name: dgx, gpus: 8}]\njobs: [{name: j, pods: [{gpu: 1}]}]\n",
		slow:  "name: slow\ncycles: 10000\nnodes: [{name: dgx, gpus: 8}]\njobs: [{name: j, minMember: 1, pods: [{count: 50, gpu: 1}]}]\n",
	} {
		if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var stdout, stderr bytes.Buffer
	start := time.Now()
	rc := runScenarios([]string{"--json", "--trace", "--timeout", "300ms", quick, slow}, &stdout, &stderr)
	took := time.Since(start)
	if rc != 2 {
		t.Fatalf("exit %d, want 2; stderr %q", rc, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	msg := regexp.MustCompile(`^tessera-sim run: ` + regexp.QuoteMeta(slow) + `: scenario "slow": did not finish within --timeout 300ms \(in cycle (\d+) of 10000\); use fewer cycles, pods or nodes, or a longer --timeout$`)
	m := msg.FindStringSubmatch(lines[len(lines)-1])
	if m == nil {
		t.Fatalf("last line of stderr %q does not match %s", lines[len(lines)-1], msg)
	}
	if c, _ := strconv.Atoi(m[1]); c < 1 || c >= 10000 {
		t.Errorf("cycle %d reached", c)
	}
	if !strings.HasPrefix(stdout.String(), `{"name":"quick","passed":true`) || strings.Count(stdout.String(), "\n") != 1 {
		t.Errorf("stdout should hold quick's report only, got %q", stdout.String())
	}
	if took > 10*time.Second {
		t.Errorf("the run returned %v after it started; the limit was 300ms", took)
	}
}

func TestTimeoutFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		rc   int
		want string
	}{
		{[]string{"--timeout", "-1s", "x.yaml"}, 2, "tessera-sim run: --timeout -1s is negative (0 means no limit)\n"},
		{[]string{"--timeout", "soon", "x.yaml"}, 2, `invalid value "soon" for flag -timeout`},
		{[]string{"--timeout", "0", "../../controller/testdata/scenarios/gang.yaml"}, 0, ""},
	} {
		var stdout, stderr bytes.Buffer
		rc := runScenarios(c.args, &stdout, &stderr)
		if rc != c.rc || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", c.args, rc, stderr.String(), c.rc, c.want)
		}
	}
	var stdout, stderr bytes.Buffer
	runScenarios([]string{"--help"}, &stdout, &stderr)
	if !strings.Contains(stdout.String(), "(default 5m;") || defaultTimeout != 5*time.Minute {
		t.Errorf("help does not give the default timeout, 5m: %q", stdout.String())
	}
}
