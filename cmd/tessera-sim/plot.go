package main

import (
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/controller/scenario"
	"github.com/tessera-gpu/tessera/internal/fairplot"
)

// plotPaths names the picture of each plotted scenario: path itself when
// there is one, else path with "-<scenario>" before its extension.
func plotPaths(path string, names []string) []string {
	if len(names) == 1 {
		return []string{path}
	}
	ext := filepath.Ext(path)
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = strings.TrimSuffix(path, ext) + "-" + n + ext
	}
	return out
}

// writePlots draws each timed run's fairness samples (--plot).
func writePlots(path string, specs []*scenario.Spec, reps []*scenario.Report) ([]string, error) {
	var names []string
	var charts []*fairplot.Chart
	for i, rep := range reps {
		if rep.Fairness == nil {
			continue
		}
		c, err := fairnessChart(specs[i], rep.Fairness)
		if err != nil {
			return nil, fmt.Errorf("scenario %q: %w", specs[i].Name, err)
		}
		names = append(names, specs[i].Name)
		charts = append(charts, c)
	}
	if len(charts) == 0 {
		return nil, fmt.Errorf("--plot: no timed scenario (time:) to draw")
	}
	paths := plotPaths(path, names)
	for i, c := range charts {
		if err := fairplot.Save(c, paths[i]); err != nil {
			return nil, err
		}
	}
	return paths, nil
}

// fairnessChart turns a fairness report into a picture: each leaf queue's
// allocation, fair share and quota at every sample, the windows in which
// a schedule changed its settings, and the cluster's GPUs.
func fairnessChart(s *scenario.Spec, f *scenario.FairnessReport) (*fairplot.Chart, error) {
	c := &fairplot.Chart{Title: s.Name, XLabel: "hour"}
	for _, n := range s.Nodes {
		c.Capacity += float64(n.GPUs)
	}
	var queues []string
	for q := range f.Queues {
		queues = append(queues, q)
	}
	sort.Strings(queues)
	series := make([]fairplot.Queue, len(queues))
	open := make([]float64, len(queues)) // start of a window being read; -1: none
	for i, q := range queues {
		series[i].Name = q
		open[i] = -1
	}
	num := func(n fmt.Stringer) float64 { v, _ := strconv.ParseFloat(n.String(), 64); return v }
	for _, smp := range f.Samples {
		x := num(smp.Hour)
		c.X = append(c.X, x)
		for i, q := range queues {
			sq := smp.Queues[q]
			series[i].Allocated = append(series[i].Allocated, num(sq.GPUAllocated))
			series[i].FairShare = append(series[i].FairShare, num(sq.GPUFairShare))
			series[i].Quota = append(series[i].Quota, num(sq.GPUQuota))
			switch {
			case sq.Scheduled && open[i] < 0:
				open[i] = x
			case !sq.Scheduled && open[i] >= 0:
				c.Windows = append(c.Windows, fairplot.Window{Queue: q, From: open[i], To: x})
				open[i] = -1
			}
		}
	}
	for i, q := range queues {
		if open[i] >= 0 && len(c.X) > 0 {
			c.Windows = append(c.Windows, fairplot.Window{Queue: q, From: open[i], To: c.X[len(c.X)-1]})
		}
	}
	c.Queues = series
	return c, c.Validate()
}
