package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/crdapply"
)

// applyCRDsCommand applies the chart's CRDs (the pre-install/pre-upgrade
// hook, chart/tessera/templates/crds-hook.yaml): Helm never upgrades crds/.
const applyCRDsCommand = "apply-crds"

func runApplyCRDs(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tessera-controller "+applyCRDsCommand, flag.ContinueOnError)
	klog.InitFlags(fs)
	dir := fs.String("dir", "/crds", "directory of the CRD manifests (*.yaml) to apply")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file; the in-cluster config when empty")
	timeout := fs.Duration("timeout", 2*time.Minute, "how long to wait for the CRDs to be Established")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected arguments: %v", applyCRDsCommand, fs.Args())
	}
	crds, err := crdapply.ReadDir(*dir)
	if err != nil {
		return err
	}
	rc, err := (&options{kubeconfig: *kubeconfig}).restConfig()
	if err != nil {
		return err
	}
	client, err := dynamic.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("creating Kubernetes client: %w", err)
	}
	return crdapply.Apply(ctx, client, crds, *timeout)
}
