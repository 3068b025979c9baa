package main

import (
	"context"
	"flag"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/controller/core"
)

func parse(t *testing.T, args ...string) (*options, error) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	var o options
	bindFlags(fs, &o)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return &o, o.validate()
}

func TestFlagDefaults(t *testing.T) {
	o, err := parse(t)
	if err != nil {
		t.Fatal(err)
	}
	if o.qps != 500 || o.burst != 1000 || !o.leaderElect || o.interval != time.Second || o.placement != "binpack" || !o.consolidation {
		t.Errorf("unexpected defaults: %+v", o)
	}
	cfg := o.appConfig(&rest.Config{})
	if cfg.Core.Placement != core.BinPack || cfg.Core.DisableConsolidation || cfg.Core.StaleGangTimeout != core.DefaultStaleGangTimeout {
		t.Errorf("core config %+v", cfg.Core)
	}
	if !cfg.LeaderElect || cfg.LeaseName != "tessera-controller" || cfg.LeaseDuration != 15*time.Second || !cfg.ReleaseOnCancel {
		t.Errorf("leader election config %+v", cfg)
	}
	if cfg.WebhookAddr != "" {
		t.Errorf("webhook on by default: %q", cfg.WebhookAddr)
	}
	if cfg.GPUResource != "nvidia.com/gpu" {
		t.Errorf("GPU resource %q", cfg.GPUResource)
	}
}

func TestFlags(t *testing.T) {
	o, err := parse(t, "--placement=spread", "--consolidation=false", "--stale-gang-timeout=-1s", "--workers=4", "--interval=250ms", "--gpu-resource-name=example.com/gpu")
	if err != nil {
		t.Fatal(err)
	}
	cfg := o.appConfig(&rest.Config{})
	if cfg.Core.Placement != core.Spread || !cfg.Core.DisableConsolidation || cfg.Core.StaleGangTimeout >= 0 || cfg.Workers != 4 || cfg.Interval != 250*time.Millisecond || cfg.GPUResource != "example.com/gpu" {
		t.Errorf("config %+v", cfg)
	}
}

func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--placement=random"}, "binpack or spread"},
		{[]string{"--interval=0"}, "--interval"},
		{[]string{"--workers=0"}, "--workers"},
		{[]string{"--gpu-resource-name=gpu"}, "--gpu-resource-name"},
		{[]string{"--webhook-addr=:9443", "--webhook-cert-dir="}, "--webhook-cert-dir"},
		{[]string{"--kube-api-qps=0"}, "--kube-api-qps"},
		{[]string{"--leader-elect-lease-duration=5s", "--leader-elect-renew-deadline=10s"}, "lease duration > renew deadline"},
	} {
		_, err := parse(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an error with %q", tc.args, err, tc.want)
		}
	}
}

func TestRunRejectsArguments(t *testing.T) {
	err := run(context.Background(), []string{"extra"})
	if err == nil || !strings.Contains(err.Error(), "unexpected arguments") {
		t.Errorf("got %v", err)
	}
}
