package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// The mutation pass (controller/testdata/mutations): each entry breaks one
// rule of DESIGN.md's "Scheduling semantics" in controller/core by exact
// text edits, the scenario runner (testdata/mutant: what `tessera-sim run`
// runs, without the commands that link client-go and gonum/plot, so a build
// takes a third of the time) is built with the edits as a -overlay (the tree
// is never touched), the scenario suite runs, and the scenarios that fail
// are recorded. A rule is guarded when some scenario fails; an entry marked
// equivalent must change nothing (the suite passes), and says why.
// controller/testdata/scenarios/MUTATIONS.md is this test's output: run
// with -update-mutations to rewrite it after adding scenarios or entries.

var updateMutations = flag.Bool("update-mutations", false, "rewrite controller/testdata/scenarios/MUTATIONS.md from the mutation pass")

const (
	mutationsDir  = "../../controller/testdata/mutations"
	scenariosGlob = "../../controller/testdata/scenarios/*.yaml"
	mutationsDoc  = "../../controller/testdata/scenarios/MUTATIONS.md"
	// Scenarios written because a mutation survived the rest of the suite.
	mutationScenarios = "../../controller/testdata/scenarios/mutations.yaml"
)

type mutation struct {
	Rule     string `yaml:"rule"`
	Mutation string `yaml:"mutation"`
	File     string `yaml:"file"` // relative to the repository root
	Edits    []struct {
		Old string `yaml:"old"`
		New string `yaml:"new"`
	} `yaml:"edits"`
	// Equivalent, when set, says why the edit cannot change any outcome;
	// the suite must then pass.
	Equivalent string `yaml:"equivalent"`
}

func loadMutations(t *testing.T) []mutation {
	files, err := filepath.Glob(filepath.Join(mutationsDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no mutation files in %s: %v", mutationsDir, err)
	}
	var all []mutation
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var ms []mutation
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(&ms); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for i, m := range ms {
			if m.Rule == "" || m.Mutation == "" || m.File == "" || len(m.Edits) == 0 {
				t.Fatalf("%s: entry %d needs rule, mutation, file and edits", f, i+1)
			}
		}
		all = append(all, ms...)
	}
	return all
}

// apply returns the file with every edit made; each old text must occur
// exactly once, so an entry that no longer matches the code fails loudly
// instead of testing nothing.
func (m *mutation) apply(src string) (string, error) {
	for i, e := range m.Edits {
		if n := strings.Count(src, e.Old); n != 1 {
			return "", fmt.Errorf("edit %d: the old text occurs %d times in %s (want once):\n%s", i+1, n, m.File, e.Old)
		}
		src = strings.Replace(src, e.Old, e.New, 1)
	}
	return src, nil
}

// TestMutationsApply checks, in seconds and in -short too, that every entry
// still matches the code it quotes and leaves parseable Go: code moved by a
// refactoring fails here at once instead of 20 minutes into the pass.
func TestMutationsApply(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range loadMutations(t) {
		src, err := os.ReadFile(filepath.Join(root, m.File))
		if err != nil {
			t.Errorf("mutation %d (%s): %v", i, m.Mutation, err)
			continue
		}
		mutated, err := m.apply(string(src))
		if err != nil {
			t.Errorf("mutation %d (%s): %v", i, m.Mutation, err)
			continue
		}
		if mutated == string(src) {
			t.Errorf("mutation %d (%s): its edits change nothing in %s", i, m.Mutation, m.File)
		}
		if _, err := parser.ParseFile(token.NewFileSet(), m.File, mutated, parser.SkipObjectResolution); err != nil {
			t.Errorf("mutation %d (%s): the mutated %s does not parse: %v", i, m.Mutation, m.File, err)
		}
	}
}

func TestMutations(t *testing.T) {
	if testing.Short() {
		t.Skip("the mutation pass builds the scenario runner once per mutation (minutes); not in -short")
	}
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			t.Fatalf("the mutation pass needs the go command: %v", err)
		}
	}
	scenarios, err := filepath.Glob(scenariosGlob)
	if err != nil || len(scenarios) == 0 {
		t.Fatalf("no scenarios: %v", err)
	}
	added := scenarioNames(t, mutationScenarios)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	pass := mutationPass{goBin: goBin, root: root, tmp: t.TempDir(), scenarios: scenarios}
	ms := loadMutations(t)
	failing := make([][]string, len(ms))
	errs := make([]error, len(ms))
	// Mutants build and run side by side: a build is mostly the serial
	// compile of the mutated package and a link, so two at a time keep both
	// cores busy where one left one idle.
	sem := make(chan struct{}, mutationWorkers())
	var wg sync.WaitGroup
	for i := range ms {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			failing[i], errs[i] = pass.run(i, &ms[i])
		}()
	}
	wg.Wait()
	for i, m := range ms {
		if errs[i] != nil {
			t.Errorf("mutation %d (%s): %v", i, m.Mutation, errs[i])
		}
	}
	if t.Failed() {
		return // a pass with mutants that did not run has no table to write
	}
	for i, m := range ms {
		switch {
		case m.Equivalent == "" && len(failing[i]) == 0:
			t.Errorf("mutation %d survived: rule %q, %s — no scenario fails", i, m.Rule, m.Mutation)
		case m.Equivalent != "" && len(failing[i]) > 0:
			t.Errorf("mutation %d is marked equivalent but fails %v: %s", i, failing[i], m.Equivalent)
		}
	}
	doc := mutationsTable(ms, failing, added)
	if *updateMutations {
		if err := os.WriteFile(mutationsDoc, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	have, err := os.ReadFile(mutationsDoc)
	if err != nil || string(have) != doc {
		t.Errorf("%s is not the mutation pass's output; run go test ./cmd/tessera-sim -run TestMutations -update-mutations and review the diff", mutationsDoc)
	}
}

// mutationWorkers is how many mutants build and run at once: one per CPU,
// at most four (TESSERA_MUTATION_WORKERS overrides).
func mutationWorkers() int {
	if n, err := strconv.Atoi(os.Getenv("TESSERA_MUTATION_WORKERS")); err == nil && n > 0 {
		return n
	}
	return min(runtime.GOMAXPROCS(0), 4)
}

// mutationPass builds and runs one mutant at a time per call; calls may run
// concurrently (each mutant has its own directory).
type mutationPass struct {
	goBin, root, tmp string
	scenarios        []string
}

// run builds the scenario runner with m's edits as an overlay, runs the
// suite and returns the scenarios that fail.
func (p mutationPass) run(i int, m *mutation) ([]string, error) {
	src, err := os.ReadFile(filepath.Join(p.root, m.File))
	if err != nil {
		return nil, err
	}
	mutated, err := m.apply(string(src))
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(p.tmp, fmt.Sprint(i))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	// Each mutant's binary is several MB and there are over a hundred: keep
	// the disk a CI machine shares with the other packages' tests.
	defer os.RemoveAll(dir)
	mfile := filepath.Join(dir, filepath.Base(m.File))
	overlay, _ := json.Marshal(map[string]map[string]string{"Replace": {filepath.Join(p.root, m.File): mfile}})
	bin := filepath.Join(dir, "mutant")
	if err := os.WriteFile(mfile, []byte(mutated), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "overlay.json"), overlay, 0o644); err != nil {
		return nil, err
	}
	// -s -w: no symbol table or DWARF; the mutant is run, never debugged, and
	// the link is a large part of each build.
	build := exec.Command(p.goBin, "build", "-ldflags=-s -w", "-overlay", filepath.Join(dir, "overlay.json"), "-o", bin, "./testdata/mutant")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("does not build: %w\n%s", err, out)
	}
	// A mutation may make a cycle loop; a minute is far beyond the suite's
	// tenth of a second.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run := exec.CommandContext(ctx, bin, p.scenarios...)
	var stdout, stderr bytes.Buffer
	run.Stdout, run.Stderr = &stdout, &stderr
	if err := run.Run(); err != nil {
		return nil, fmt.Errorf("the scenario runner: %w: %s", err, stderr.String())
	}
	var failing []string
	dec := json.NewDecoder(&stdout)
	for dec.More() {
		var r struct {
			Name   string `json:"name"`
			Passed bool   `json:"passed"`
		}
		if err := dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("report: %w", err)
		}
		if !r.Passed {
			failing = append(failing, r.Name)
		}
	}
	return failing, nil
}

// scenarioNames lists the names of the scenarios in one file.
func scenarioNames(t *testing.T, file string) map[string]bool {
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var s struct {
			Name string `yaml:"name"`
		}
		if err := dec.Decode(&s); err != nil {
			break
		}
		names[s.Name] = true
	}
	return names
}

func mutationsTable(ms []mutation, failing [][]string, added map[string]bool) string {
	var b strings.Builder
	b.WriteString(`# Mutation pass over controller/core

Generated by ` + "`go test ./cmd/tessera-sim -run TestMutations -update-mutations`" + `; ` + "`make test`" + ` checks that
it is current. Each row breaks one rule of DESIGN.md's "Scheduling semantics" in controller/core (one
default: in the scenario loader) with the exact edits listed in ` + "`controller/testdata/mutations/`" + `, builds the scenario runner (` + "`cmd/tessera-sim/testdata/mutant`" + `) with them as a ` + "`-overlay`" + `
(the tree is not touched), runs the scenario suite and lists the scenarios that fail. A rule is guarded
when some scenario fails; the test fails when a mutation survives, or when an edit no longer matches the
code. Scenarios in *italics* live in ` + "`mutations.yaml`" + `: they were written because the mutation survived
the rest of the suite. A row marked equivalent cannot change any outcome (it says why), and the test
checks that the suite then passes.

| # | rule | mutation | failing scenarios |
|---|---|---|---|
`)
	for i, m := range ms {
		var cell string
		if m.Equivalent != "" {
			cell = "none — equivalent: " + m.Equivalent
		} else {
			names := slices.Clone(failing[i])
			sort.Strings(names)
			for j, n := range names {
				if added[n] {
					names[j] = "*" + n + "*"
				}
			}
			cell = strings.Join(names, ", ")
		}
		fmt.Fprintf(&b, "| %d | %s | %s (`%s`) | %s |\n", i, m.Rule, m.Mutation, m.File, cell)
	}
	return b.String()
}
