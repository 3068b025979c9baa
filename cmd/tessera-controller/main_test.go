package main

import (
	"context"
	"flag"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/controller/app"
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
	// History on (status and metrics), not weighed: fair share as before.
	if u := cfg.Usage; u == nil || u.Config != (core.UsageConfig{HalfLife: 24 * time.Hour, Window: 7 * 24 * time.Hour, Bucket: 5 * time.Minute}) || u.Name != "tessera-usage" || cfg.Core.UsageCoefficient != 0 {
		t.Errorf("usage history %+v, coefficient %d", u, cfg.Core.UsageCoefficient)
	}
}

func TestUsageFlags(t *testing.T) {
	o, err := parse(t, "--usage-coefficient=0.5", "--usage-bucket=1m", "--usage-window=1h", "--usage-half-life=0", "--usage-configmap=u", "--usage-namespace=ns")
	if err != nil {
		t.Fatal(err)
	}
	cfg := o.appConfig(&rest.Config{})
	if u := cfg.Usage; u == nil || u.Config != (core.UsageConfig{Window: time.Hour, Bucket: time.Minute}) || u.Name != "u" || u.Namespace != "ns" || cfg.Core.UsageCoefficient != 500 {
		t.Errorf("usage history %+v, coefficient %d", u, cfg.Core.UsageCoefficient)
	}
	if o, err = parse(t, "--usage-history=false"); err != nil || o.appConfig(&rest.Config{}).Usage != nil {
		t.Errorf("--usage-history=false: %v, %+v", err, o)
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

// TestShadowFlags: --shadow turns off what writes, takes its own Lease, and
// passes the namespaces and selector on.
func TestShadowFlags(t *testing.T) {
	o, err := parse(t, "--shadow", "--shadow-namespaces= ml, research ,", "--shadow-selector=team=a")
	if err != nil {
		t.Fatal(err)
	}
	cfg := o.appConfig(&rest.Config{})
	if cfg.Shadow == nil || cfg.PodGrouper || cfg.Usage != nil || cfg.LeaseName != app.DefaultShadowLeaseName {
		t.Fatalf("config %+v", cfg)
	}
	if got := cfg.Shadow.Namespaces; !slices.Equal(got, []string{"ml", "research"}) {
		t.Errorf("namespaces %q", got)
	}
	if got := cfg.Shadow.Selector.String(); got != "team=a" {
		t.Errorf("selector %q", got)
	}
	if o, _ = parse(t, "--shadow", "--leader-elect-lease-name=mine"); o.appConfig(&rest.Config{}).LeaseName != "mine" {
		t.Errorf("an explicit Lease name is kept")
	}
	if o, _ = parse(t); o.appConfig(&rest.Config{}).Shadow != nil {
		t.Errorf("shadow mode without --shadow")
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
		{[]string{"--usage-coefficient=101"}, "--usage-coefficient must be from 0 to 100"},
		{[]string{"--usage-coefficient=-1"}, "--usage-coefficient"},
		{[]string{"--usage-coefficient=1", "--usage-history=false"}, "needs --usage-history"},
		{[]string{"--usage-bucket=5m", "--usage-window=7m"}, "whole number of buckets"},
		{[]string{"--usage-bucket=1m", "--usage-window=168h"}, "at most 2016"},
		{[]string{"--usage-half-life=-1h"}, "halfLife"},
		{[]string{"--usage-configmap="}, "--usage-configmap"},
		{[]string{"--shadow-namespaces=a"}, "need --shadow"},
		{[]string{"--shadow", "--webhook-addr=:9443"}, "no admission webhook"},
		{[]string{"--shadow", "--usage-coefficient=1"}, "no usage history"},
		{[]string{"--shadow", "--shadow-selector=app in (a"}, `--shadow-selector "app in (a"`},
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
