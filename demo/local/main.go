// Command local is Tessera's local demo (`make demo`): a real control plane
// (etcd, kube-apiserver, kube-controller-manager built from Go modules), kwok
// nodes each with a real tessera-node process publishing fake GPUs, and the
// real tessera-controller scheduling the example workloads of demo/examples —
// two teams' queues, a training gang, MPS inference fractions, whole-GPU
// jobs, a pod in an unknown queue — then a reclaim when team-b arrives. It
// prints where everything landed and why, and tears it all down.
//
//	go run ./demo/local [--tessera-bin bin/] [--bin-dir DIR]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	var opts Options
	flag.StringVar(&opts.TesseraBin, "tessera-bin", "", "folder with tessera-node and tessera-controller (default: go build them)")
	flag.StringVar(&opts.BinDir, "bin-dir", os.Getenv("TESSERA_BIN_DIR"), "folder with etcd, kube-apiserver, kube-controller-manager, kwok (default: $TESSERA_BIN_DIR, else hack/build-controlplane.sh)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	if _, err := Run(ctx, opts); err != nil {
		fmt.Fprintf(os.Stderr, "demo failed: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("\nThe demo took %s.\n", time.Since(start).Round(time.Second))
}
