package realnode_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/test/controlplane"
	"github.com/tessera-gpu/tessera/test/realnode"
)

// TestBusyboxPods runs pods on the real node: one that exits, one that
// keeps running (torn down by the node's cleanup), and reads their logs
// through the apiserver and the kubelet.
func TestBusyboxPods(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	node := realnode.Start(t, cp, realnode.Options{AfterTeardown: func(before map[string]string) { checkTeardown(t, before) }})
	client := cp.Client(t)
	ctx := context.Background()
	const ns = metav1.NamespaceDefault

	done := realnode.BusyboxPod(ns, "hello", node.Name, `echo "hello from $(hostname)"; echo "uid $(id -u)"`)
	if _, err := client.CoreV1().Pods(ns).Create(ctx, done, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod: %v", err)
	}
	runs := realnode.BusyboxPod(ns, "sleeper", node.Name, `echo "ip $(hostname -i)"; exec sleep 3600`)
	if _, err := client.CoreV1().Pods(ns).Create(ctx, runs, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod: %v", err)
	}

	start := time.Now()
	realnode.WaitPod(t, client, ns, "hello", 2*time.Minute, "Succeeded", realnode.PodPhase(corev1.PodSucceeded))
	t.Logf("pod hello Succeeded %s after creation", time.Since(start).Round(10*time.Millisecond))
	if logs := realnode.PodLogs(t, client, ns, "hello"); !strings.Contains(logs, "hello from hello\n") || !strings.Contains(logs, "uid 0\n") {
		t.Errorf("logs of hello = %q, want the hostname and uid it printed", logs)
	}

	p := realnode.WaitPod(t, client, ns, "sleeper", time.Minute, "Running", realnode.PodPhase(corev1.PodRunning))
	ip := net.ParseIP(p.Status.PodIP)
	if _, pods, _ := net.ParseCIDR("10.244.0.0/24"); ip == nil || !pods.Contains(ip) {
		t.Errorf("pod IP %q is not from the bridge network", p.Status.PodIP)
	}
	// A running container's log may lag its start by a moment.
	deadline := time.Now().Add(10 * time.Second)
	for {
		logs := realnode.PodLogs(t, client, ns, "sleeper")
		if strings.Contains(logs, "ip "+p.Status.PodIP) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("logs of sleeper = %q, want %q", logs, "ip "+p.Status.PodIP)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkTeardown verifies, at the end of the node's teardown (while it still
// holds the real-node lock, so no other test's node is up), that the host is
// as it was: the kubelet's sysctls restored to what the node found, nothing
// mounted under the kubelet's root or the node's state, no pod cgroups, no
// CNI bridge.
func checkTeardown(t *testing.T, before map[string]string) {
	{
		for k, v := range before {
			if b, _ := os.ReadFile("/proc/sys/" + k); strings.TrimSpace(string(b)) != v {
				t.Errorf("sysctl %s = %q after teardown, was %q", k, strings.TrimSpace(string(b)), v)
			}
		}
		mounts, _ := os.ReadFile("/proc/self/mountinfo")
		for _, dir := range []string{" /var/lib/kubelet", " /var/lib/tessera-realnode"} {
			if strings.Contains(string(mounts), dir) {
				t.Errorf("mounts under %s remain after teardown", dir)
			}
		}
		if m, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods"); len(m) > 0 {
			t.Errorf("pod cgroups remain after teardown: %v", m)
		}
		if _, err := net.InterfaceByName("tessera0"); err == nil {
			t.Errorf("CNI bridge tessera0 remains after teardown")
		}
	}
}
