// Package realnode adds a real Kubernetes node to the test control plane:
// kubelet and containerd (CDI on) built from Go modules, runc and the CNI
// plugins from Debian, and locally built images. See README.md.
package realnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/childproc"
	"github.com/tessera-gpu/tessera/test/controlplane"
)

// Options tune the node. The zero value is a node named "tessera-real".
type Options struct {
	// Name is the node's name (default "tessera-real").
	Name string
	// Labels are added to the Node at registration.
	Labels map[string]string
	// FeatureGates for the kubelet; controlplane.DefaultFeatureGates are
	// always set, these override them.
	FeatureGates map[string]bool
	// KubeletArgs are appended to the kubelet's command line (e.g.
	// --vmodule=dra_plugin=4 logs every NodePrepareResources call).
	KubeletArgs []string
	// ReadyTimeout bounds the wait for the Node to be Ready (default 2m).
	ReadyTimeout time.Duration
	// AfterTeardown, when set, runs at the end of the teardown while the
	// machine-wide real-node lock is still held, with the sysctl values
	// found before the node started: a test checks there that the host is
	// as it was, before another test's node can start.
	AfterTeardown func(sysctlsBefore map[string]string)
}

// Node is a running real node. Its fields are read-only.
type Node struct {
	Name string
	IP   string
	// CDIDir is the only CDI spec directory containerd reads.
	CDIDir string
	// PluginRegistryDir and PluginsDir are the kubelet's (fixed) plugin
	// registration and plugin socket directories; DevicePluginsDir the
	// device-plugin directory.
	PluginRegistryDir, PluginsDir, DevicePluginsDir string
	// BusyboxImage and PauseImage are imported and never pulled.
	BusyboxImage, PauseImage string
	// LogDir holds kubelet.log and containerd.log (kept when a test fails).
	LogDir string
	// BinDir holds kubelet, containerd, containerd-shim-runc-v2 and ctr.
	BinDir string
	// ContainerdSocket is containerd's gRPC socket (for ctr --address).
	ContainerdSocket string

	cp         *controlplane.ControlPlane
	client     kubernetes.Interface
	logf       func(string, ...any)
	lock       *os.File
	sysctls    map[string]string
	afterDown  func(map[string]string)
	containerd *proc
	kubelet    *proc
	stopOnce   sync.Once
}

// Start runs a real node joined to cp and tears it down at t's cleanup. It
// skips under -short, and when the machine cannot run one (not root, no
// writable cgroups, no mounts). Only one real node runs per machine at a
// time: Start waits for another test binary's node to go.
func Start(t testing.TB, cp *controlplane.ControlPlane, opts Options) *Node {
	t.Helper()
	if testing.Short() {
		t.Skip("real node (kubelet + containerd) skipped with -short")
	}
	if why := hostUsable(); why != "" {
		t.Skip("real node: " + why)
	}
	if opts.Name == "" {
		opts.Name = "tessera-real"
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 2 * time.Minute
	}
	began := time.Now()
	lock, err := lockNode(t.Logf)
	if err != nil {
		t.Fatalf("real node: %v", err)
	}
	logDir, err := os.MkdirTemp("", "tessera-realnode-")
	if err != nil {
		lock.Close()
		t.Fatalf("real node: creating log dir: %v", err)
	}
	n := &Node{
		Name:              opts.Name,
		CDIDir:            filepath.Join(stateDir, "cdi"),
		PluginRegistryDir: filepath.Join(kubeletRoot, "plugins_registry"),
		PluginsDir:        filepath.Join(kubeletRoot, "plugins"),
		DevicePluginsDir:  filepath.Join(kubeletRoot, "device-plugins"),
		BusyboxImage:      BusyboxImage,
		PauseImage:        PauseImage,
		LogDir:            logDir,
		ContainerdSocket:  filepath.Join(stateDir, "containerd", "containerd.sock"),
		cp:                cp,
		client:            cp.Client(t),
		logf:              t.Logf,
		lock:              lock,
		afterDown:         opts.AfterTeardown,
	}
	// Registered before anything starts, so a failed start is cleaned too.
	t.Cleanup(func() { n.stop(t.Failed()) })
	// A client cert for system:node:<name>, so the Node authorizer and
	// NodeRestriction apply to this kubelet as to any real one.
	kubeconfig := cp.WriteKubeconfig(t, cp.UserConfig("system:node:"+n.Name, "system:nodes"))
	if err := n.start(opts, kubeconfig); err != nil {
		t.Fatalf("real node: %v", err)
	}
	t.Logf("real node %s Ready in %s (ip %s, logs %s)", n.Name, time.Since(began).Round(100*time.Millisecond), n.IP, n.LogDir)
	return n
}

func (n *Node) start(opts Options, kubeconfig string) error {
	if err := ensurePackages(n.logf); err != nil {
		return err
	}
	bin, err := binDir()
	if err != nil {
		return err
	}
	n.BinDir = bin
	cache, err := cacheDir()
	if err != nil {
		return err
	}
	images, err := buildImages(cache)
	if err != nil {
		return err
	}
	if n.IP, err = defaultRouteIP(); err != nil {
		return err
	}
	// An earlier test binary may have died without its cleanup.
	if err := wipeHost(n.ContainerdSocket); err != nil {
		return fmt.Errorf("cleaning up an earlier real node: %w", err)
	}
	n.sysctls = readSysctls()

	p := paths{
		socket:        n.ContainerdSocket,
		root:          filepath.Join(stateDir, "containerd", "root"),
		state:         filepath.Join(stateDir, "containerd", "state"),
		cdi:           n.CDIDir,
		cniConf:       filepath.Join(stateDir, "cni", "net.d"),
		cniData:       filepath.Join(stateDir, "cni", "ipam"),
		kubeletConfig: filepath.Join(stateDir, "kubelet-config.yaml"),
	}
	for _, d := range []string{p.root, p.state, p.cdi, p.cniConf, p.cniData, kubeletRoot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	gates := maps.Clone(controlplane.DefaultFeatureGates)
	maps.Copy(gates, opts.FeatureGates)
	files := map[string]string{
		filepath.Join(stateDir, "containerd.toml"):      containerdConfig(p),
		filepath.Join(p.cniConf, "10-tessera.conflist"): cniConfig(p),
		p.kubeletConfig: kubeletConfig(p, n.IP, n.cp.CAFile, gates),
	}
	for path, data := range files {
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
	}

	// Our bin dir first: containerd finds its shim on PATH.
	env := []string{"PATH=" + bin + ":" + os.Getenv("PATH")}
	n.containerd, err = childproc.Start(n.LogDir, "containerd", filepath.Join(bin, "containerd"),
		[]string{"--config", filepath.Join(stateDir, "containerd.toml"), "--log-level", "info"}, env)
	if err != nil {
		return err
	}
	recordPID(n.containerd)
	if err := n.waitContainerd(); err != nil {
		return err
	}
	for _, img := range images {
		if out, err := n.Ctr("-n", "k8s.io", "images", "import", "--local", img); err != nil {
			return fmt.Errorf("importing %s: %w: %s", img, err, out)
		}
	}

	args := []string{
		"--config", p.kubeletConfig,
		"--kubeconfig", kubeconfig,
		"--hostname-override", n.Name,
		"--node-ip", n.IP,
		"--v", "2",
	}
	if len(opts.Labels) > 0 {
		var l []string
		for k, v := range opts.Labels {
			l = append(l, k+"="+v)
		}
		args = append(args, "--node-labels", strings.Join(l, ","))
	}
	args = append(args, opts.KubeletArgs...)
	n.kubelet, err = childproc.Start(n.LogDir, "kubelet", filepath.Join(bin, "kubelet"), args, env)
	if err != nil {
		return err
	}
	recordPID(n.kubelet)
	return n.waitReady(opts.ReadyTimeout)
}

// ImportImage imports an image archive (docker-archive or OCI) into the
// node's containerd, where pods with imagePullPolicy Never find it.
func (n *Node) ImportImage(archive string) error {
	if out, err := n.Ctr("-n", "k8s.io", "images", "import", "--local", archive); err != nil {
		return fmt.Errorf("importing %s: %w: %s", archive, err, out)
	}
	return nil
}

// Ctr runs ctr against the node's containerd and returns its combined
// output.
func (n *Node) Ctr(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(n.BinDir, "ctr"), append([]string{"--address", n.ContainerdSocket}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (n *Node) waitContainerd() error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := n.Ctr("version"); err == nil {
			return nil
		}
		if done, err := n.containerd.Exited(); done {
			return fmt.Errorf("containerd exited (%v); last lines of %s:\n%s", err, n.containerd.LogPath, childproc.TailFile(n.containerd.LogPath, 30))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd did not answer in 30s; last lines of %s:\n%s", n.containerd.LogPath, childproc.TailFile(n.containerd.LogPath, 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (n *Node) waitReady(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		node, err := n.client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err == nil {
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					return nil
				}
			}
		}
		for _, p := range []*proc{n.kubelet, n.containerd} {
			if done, err := p.Exited(); done {
				return fmt.Errorf("%s exited (%v) before the node was Ready; last lines of %s:\n%s", p.Name, err, p.LogPath, childproc.TailFile(p.LogPath, 40))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s not Ready after %s; last lines of %s:\n%s", n.Name, timeout, n.kubelet.LogPath, childproc.TailFile(n.kubelet.LogPath, 40))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// stop tears the node down: pods first (so the kubelet unmounts volumes,
// tears down network namespaces and calls the DRA plugins' Unprepare),
// then the kubelet, the containers, containerd, and whatever they left on
// the host.
func (n *Node) stop(failed bool) {
	n.stopOnce.Do(func() {
		defer n.lock.Close()
		var errs []error
		if n.kubelet != nil {
			if err := n.deletePods(90 * time.Second); err != nil {
				errs = append(errs, err)
			}
			n.kubelet.Stop(20 * time.Second)
		}
		if n.containerd != nil {
			// Containers outlive containerd by design; stop them first.
			if out, err := n.Ctr("-n", "k8s.io", "tasks", "ls", "-q"); err == nil {
				for id := range strings.FieldsSeq(out) {
					_, _ = n.Ctr("-n", "k8s.io", "tasks", "kill", "-a", "-s", "SIGKILL", id)
					_, _ = n.Ctr("-n", "k8s.io", "tasks", "delete", "-f", id)
				}
			}
			n.containerd.Stop(20 * time.Second)
		}
		if err := wipeHost(n.ContainerdSocket); err != nil {
			errs = append(errs, err)
		}
		if n.sysctls != nil {
			if err := restoreSysctls(n.sysctls); err != nil {
				errs = append(errs, err)
			}
		}
		if n.kubelet != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := n.client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				klog.InfoS("Deleting the real node's Node object", "node", n.Name, "err", err)
			}
			cancel()
		}
		if len(errs) > 0 {
			n.logf("real node teardown: %v", errors.Join(errs...))
		}
		if n.afterDown != nil {
			n.afterDown(n.sysctls)
		}
		if failed || len(errs) > 0 {
			for _, p := range []*proc{n.containerd, n.kubelet} {
				if p != nil {
					n.logf("---- last lines of %s ----\n%s", p.LogPath, childproc.TailFile(p.LogPath, 40))
				}
			}
			n.logf("real node stopped; kept its logs in %s", n.LogDir)
			return
		}
		_ = os.RemoveAll(n.LogDir)
	})
}

// DeletePods deletes every pod bound to the node and waits until the
// kubelet has finished them (it removes the object once their containers
// are gone and their DRA claims unprepared). Tests that run a DRA plugin
// call it before stopping the plugin, so the kubelet can unprepare.
func (n *Node) DeletePods(timeout time.Duration) error { return n.deletePods(timeout) }

func (n *Node) deletePods(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	sel := fields.OneTermEqualSelector("spec.nodeName", n.Name).String()
	grace := int64(1)
	for {
		pods, err := n.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return fmt.Errorf("listing pods on %s: %w", n.Name, err)
		}
		if len(pods.Items) == 0 {
			return nil
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			err := n.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting pod %s/%s: %w", p.Namespace, p.Name, err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pods on %s still there after %s: %d left", n.Name, timeout, len(pods.Items))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// binDir returns the folder with kubelet and containerd's binaries,
// building them with hack/build-controlplane.sh when missing.
func binDir() (string, error) {
	want := []string{"kubelet", "containerd", "containerd-shim-runc-v2", "ctr"}
	if dir := os.Getenv(controlplane.EnvBinDir); dir != "" && hasAll(dir, want) {
		return dir, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	script := filepath.Join(root, "hack", "build-controlplane.sh")
	klog.InfoS("Building the real node's binaries (a cold build takes minutes)", "script", script, "binaries", want)
	cmd := exec.Command(script, want...)
	cmd.Dir = root
	cmd.Stderr = os.Stderr // progress of a long build must be visible
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("running %s %s: %w", script, strings.Join(want, " "), err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dir := strings.TrimSpace(lines[len(lines)-1])
	if !hasAll(dir, want) {
		return "", fmt.Errorf("%s did not produce %v in %s", script, want, dir)
	}
	return dir, nil
}

func hasAll(dir string, names []string) bool {
	for _, b := range names {
		if st, err := os.Stat(filepath.Join(dir, b)); err != nil || st.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// cacheDir is where the built images are kept: $TESSERA_CACHE, or _cache
// at the module root, like the binaries.
func cacheDir() (string, error) {
	if d := os.Getenv("TESSERA_CACHE"); d != "" {
		return d, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "_cache"), nil
}

// repoRoot walks up from the working directory (go test runs in the
// package's directory) to the module root.
func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working dir: %w", err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		if data, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil &&
			bytes.Contains(data, []byte("module github.com/tessera-gpu/tessera\n")) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no github.com/tessera-gpu/tessera go.mod above %s", wd)
		}
	}
}

// proc is a child process (containerd or kubelet) with its log file.
type proc = childproc.Process

// recordPID writes the pid where the next node's start-up cleanup finds it
// if this test binary dies without its cleanups.
func recordPID(p *proc) {
	_ = os.WriteFile(filepath.Join(stateDir, p.Name+".pid"), []byte(strconv.Itoa(p.Cmd.Process.Pid)+"\n"), 0o644)
}
