// Command local is Tessera's local demo (`make demo`): a real control plane
// (etcd, kube-apiserver, kube-controller-manager built from Go modules), kwok
// nodes each with a real tessera-node process publishing fake GPUs, and the
// real tessera-controller scheduling the example workloads of demo/examples —
// two teams' queues, a training gang, MPS inference fractions, whole-GPU
// jobs, a pod in an unknown queue, a reclaim when team-b arrives, then an
// Indexed Job and a PyTorchJob (Kubeflow's real training-operator) ganged
// with no PodGroup written. It prints where everything landed and why, and
// tears it all down — or, with --keep, leaves the cluster running for your
// own manifests until --down.
//
//	go run ./demo/local [--tessera-bin bin/] [--bin-dir DIR] [--keep [--no-story]] [--down]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func main() {
	var opts Options
	var keep, supervise, downFlag bool
	flag.StringVar(&opts.TesseraBin, "tessera-bin", "", "folder with tessera-node, tessera-controller and kubectl-tessera (default: go build them)")
	flag.StringVar(&opts.BinDir, "bin-dir", os.Getenv("TESSERA_BIN_DIR"), "folder with etcd, kube-apiserver, kube-controller-manager, kwok (default: $TESSERA_BIN_DIR, else hack/build-controlplane.sh)")
	flag.StringVar(&opts.OperatorsDir, "operators-dir", "", "folder linking to the workload controllers (default: $TESSERA_OPERATORS_DIR when it has training-operator, else hack/build-operators.sh training-operator)")
	flag.BoolVar(&keep, "keep", false, "leave the cluster running after the story (detached), print how to use it; stop it with --down")
	flag.BoolVar(&opts.NoStory, "no-story", false, "with --keep: only set the scene (nodes, teams' queues, training-operator), no acts")
	flag.BoolVar(&downFlag, "down", false, "stop a kept demo: every process it recorded, and its folders")
	flag.StringVar(&opts.StateDir, "state-dir", defaultStateDir(), "where a kept demo records what runs (pids, kubeconfig, log)")
	flag.StringVar(&opts.Picture, "picture", "", "where the story's picture of the queues over time goes, .svg or .png (default: demo-queues.svg in --state-dir)")
	flag.BoolVar(&supervise, "supervise", false, "internal: run as the kept demo's detached supervisor")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, opts, keep, supervise, downFlag); err != nil {
		fmt.Fprintf(os.Stderr, "demo failed: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, opts Options, keep, supervise, downFlag bool) error {
	var err error
	if opts.StateDir, err = filepath.Abs(opts.StateDir); err != nil {
		return err
	}
	switch {
	case downFlag:
		_, err := down(opts.StateDir, os.Stdout)
		return err
	case keep && !supervise:
		return startKept(ctx, opts.StateDir, os.Stdout)
	case opts.NoStory && !keep:
		return fmt.Errorf("--no-story needs --keep")
	}
	opts.Keep = keep
	if opts.Picture == "" {
		opts.Picture = filepath.Join(opts.StateDir, "demo-queues.svg")
	}
	start := time.Now()
	if _, err := Run(ctx, opts); err != nil {
		return err
	}
	if !keep {
		fmt.Printf("\nThe demo took %s.\n", time.Since(start).Round(time.Second))
	}
	return nil
}

// defaultStateDir is $TESSERA_CACHE/demo, else _cache/demo here (make runs
// the demo in the repository's root).
func defaultStateDir() string {
	if c := os.Getenv("TESSERA_CACHE"); c != "" {
		return filepath.Join(c, "demo")
	}
	return filepath.Join("_cache", "demo")
}
