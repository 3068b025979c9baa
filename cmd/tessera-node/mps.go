package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/sharing"
)

const (
	// supervisorCommand runs the MPS supervisor (the tessera-mps DaemonSet).
	supervisorCommand = "mps-supervisor"
	// cleanupCommand stops every MPS daemon below the MPS root (uninstall).
	cleanupCommand = "mps-cleanup"
)

// mpsControl resolves --mps-control: empty means the real control program,
// or with fake GPUs the built-in stand-in (this binary's mps-standin), which
// the image has while it has no NVIDIA driver.
func mpsControl(flagValue string, fake bool) (string, []string, error) {
	if flagValue != "" {
		return flagValue, nil, nil
	}
	if !fake {
		return sharing.DefaultMPSControl, nil, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", nil, fmt.Errorf("finding tessera-node's executable for the MPS stand-in: %w", err)
	}
	return self, []string{sharing.StandInCommand}, nil
}

// runMPSCommand runs `tessera-node mps-supervisor` or `tessera-node
// mps-cleanup` and returns the exit code.
func runMPSCommand(name string, args []string) int {
	fs := flag.NewFlagSet("tessera-node "+name, flag.ContinueOnError)
	klog.InitFlags(fs)
	root := fs.String("mps-root", sharing.DefaultMPSRoot, "parent of the per-GPU MPS pipe and log directories (tessera-node's --mps-root)")
	control := fs.String("mps-control", "", "MPS control program (empty: "+sharing.DefaultMPSControl+" on PATH, or with --fake the built-in stand-in)")
	fake := fs.Bool("fake", false, "fake GPUs: run the built-in MPS stand-in")
	timeout := fs.Duration("timeout", 10*time.Second, "bound on starting or stopping one daemon")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := applyEnv(fs); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := sharing.CheckRoot(*root); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	prog, progArgs, err := mpsControl(*control, *fake)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	runner := &sharing.ProcessRunner{Control: prog, ControlArgs: progArgs, Timeout: *timeout}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background().WithValues("command", name))
	if name == cleanupCommand {
		stopped, err := runner.StopAll(ctx, *root)
		klog.FromContext(ctx).Info("MPS daemons stopped", "root", *root, "gpus", stopped)
		if err == nil {
			err = sharing.RemoveDaemonDirs(*root)
		}
		if err != nil {
			klog.FromContext(ctx).Error(err, "MPS cleanup")
			return 1
		}
		return 0
	}
	s := &sharing.Supervisor{Root: *root, Runner: runner}
	if err := s.Serve(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "MPS supervisor")
		klog.Flush()
		return 1
	}
	klog.Flush()
	return 0
}
