package realnode

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// Fixed host paths. The kubelet's root and its plugin and device-plugin
// directories are fixed, so there is one real node per machine at a time;
// everything else lives under stateDir, which is wiped before and after
// each node.
const (
	kubeletRoot = "/var/lib/kubelet"
	stateDir    = "/var/lib/tessera-realnode"
	lockPath    = "/run/tessera-realnode.lock"
	podLogsDir  = "/var/log/pods"
	ctrLogsDir  = "/var/log/containers"
	bridgeName  = "tessera0"
	runcPath    = "/usr/sbin/runc"
	cniBinDir   = "/usr/lib/cni"
	busyboxPath = "/bin/busybox"
)

// kubeletSysctls are the sysctls the kubelet sets at start; they are
// restored at teardown so that the machine behaves as before.
var kubeletSysctls = []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"}

// lockNode takes the machine-wide real-node lock, waiting for another test
// binary's node to go away. The lock dies with the process, so a crashed
// test never leaves it held.
func lockNode(logf func(string, ...any)) (*os.File, error) {
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", lockPath, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		return f, nil
	}
	logf("real node: another test holds %s; waiting for it", lockPath)
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", lockPath, err)
	}
	return f, nil
}

// hostUsable says why this machine cannot run a real node, or "" when it
// can: root, writable cgroups and working mounts are needed.
func hostUsable() string {
	if os.Geteuid() != 0 {
		return "needs root (kubelet, containerd and runc manage mounts and cgroups)"
	}
	probe := fmt.Sprintf("tessera-realnode-probe-%d", os.Getpid())
	var cg string
	if isCgroup2() {
		cg = filepath.Join("/sys/fs/cgroup", probe)
	} else {
		cg = filepath.Join("/sys/fs/cgroup/memory", probe)
	}
	if err := os.Mkdir(cg, 0o755); err != nil {
		return fmt.Sprintf("cgroups are not writable here (mkdir %s: %v)", cg, err)
	}
	_ = syscall.Rmdir(cg)
	dir, err := os.MkdirTemp("", probe)
	if err != nil {
		return fmt.Sprintf("cannot create a temp dir: %v", err)
	}
	defer os.Remove(dir)
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		return fmt.Sprintf("cannot mount here (tmpfs on %s: %v)", dir, err)
	}
	_ = syscall.Unmount(dir, 0)
	return ""
}

func isCgroup2() bool {
	var st syscall.Statfs_t
	// CGROUP2_SUPER_MAGIC
	return syscall.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == 0x63677270
}

// ensurePackages installs runc, the CNI plugins and busybox-static from
// Debian when they are missing.
func ensurePackages(logf func(string, ...any)) error {
	var missing []string
	for pkg, file := range map[string]string{
		"runc":                        runcPath,
		"containernetworking-plugins": filepath.Join(cniBinDir, "bridge"),
		"busybox-static":              busyboxPath,
	} {
		if _, err := os.Stat(file); err != nil {
			missing = append(missing, pkg)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	sort.Strings(missing)
	logf("real node: installing Debian packages %v", missing)
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	run := func(args ...string) error {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("apt-get %s: %w\n%s", strings.Join(args, " "), err, lastLines(out, 20))
		}
		return nil
	}
	// Other engineers' apt runs may hold the dpkg lock for a while.
	lockWait := "-o DPkg::Lock::Timeout=300"
	if err := run(strings.Fields(lockWait + " update -q")...); err != nil {
		return fmt.Errorf("real node needs Debian packages %v and apt-get update failed: %w", missing, err)
	}
	if err := run(append(strings.Fields(lockWait+" install -y -q --no-install-recommends"), missing...)...); err != nil {
		return fmt.Errorf("real node needs Debian packages %v: %w", missing, err)
	}
	return nil
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// defaultRouteIP returns the IPv4 address of the interface that holds the
// default route: the kubelet refuses a loopback node IP.
func defaultRouteIP() (string, error) {
	data, err := os.ReadFile("/proc/net/route")
	if err != nil {
		return "", fmt.Errorf("reading routes: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[1] != "00000000" {
			continue
		}
		iface, err := net.InterfaceByName(f[0])
		if err != nil {
			return "", fmt.Errorf("default-route interface %s: %w", f[0], err)
		}
		addrs, err := iface.Addrs()
		if err != nil {
			return "", fmt.Errorf("addresses of %s: %w", f[0], err)
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ipn.IP.String(), nil
			}
		}
		return "", fmt.Errorf("default-route interface %s has no IPv4 address", f[0])
	}
	return "", errors.New("no default route (the kubelet needs a non-loopback node IP)")
}

func readSysctls() map[string]string {
	saved := map[string]string{}
	for _, k := range kubeletSysctls {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil {
			saved[k] = strings.TrimSpace(string(b))
		}
	}
	return saved
}

func restoreSysctls(saved map[string]string) error {
	var errs []error
	for k, v := range saved {
		cur, err := os.ReadFile("/proc/sys/" + k)
		if err == nil && strings.TrimSpace(string(cur)) == v {
			continue
		}
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restoring sysctl %s=%s: %w", k, v, err))
		}
	}
	return errors.Join(errs...)
}

// mountsUnder lists mount points at or below any of roots, deepest first.
func mountsUnder(roots ...string) ([]string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading mountinfo: %w", err)
	}
	var out []string
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		for _, r := range roots {
			if mp == r || strings.HasPrefix(mp, r+"/") {
				out = append(out, mp)
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll detaches every mount under roots (the same point may be
// mounted several times, so it loops until none is left).
func unmountAll(roots ...string) error {
	for range 10 {
		mps, err := mountsUnder(roots...)
		if err != nil {
			return err
		}
		if len(mps) == 0 {
			return nil
		}
		for _, mp := range mps {
			if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				klog.InfoS("Unmount failed", "path", mp, "err", err)
			}
		}
	}
	mps, _ := mountsUnder(roots...)
	if len(mps) > 0 {
		return fmt.Errorf("mounts remain after unmounting: %v", mps)
	}
	return nil
}

// removeTree deletes dir, but only when nothing is mounted below it:
// RemoveAll would otherwise walk into a bind mount and delete host files.
func removeTree(dir string) error {
	if err := unmountAll(dir); err != nil {
		return fmt.Errorf("not removing %s: %w", dir, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return nil
}

// removeKubepodsCgroups kills what is left in the kubelet's pod cgroups
// (containers whose shim is gone) and removes them, in every hierarchy.
func removeKubepodsCgroups() error {
	var roots []string
	if isCgroup2() {
		roots = []string{"/sys/fs/cgroup/kubepods"}
	} else {
		entries, err := os.ReadDir("/sys/fs/cgroup")
		if err != nil {
			return fmt.Errorf("listing cgroup hierarchies: %w", err)
		}
		for _, e := range entries {
			roots = append(roots, filepath.Join("/sys/fs/cgroup", e.Name(), "kubepods"))
		}
	}
	var errs []error
	for _, root := range roots {
		if _, err := os.Stat(root); err != nil {
			continue
		}
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			killCgroupProcs(d)
			var err error
			for range 50 {
				if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

func killCgroupProcs(dir string) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for f := range strings.FieldsSeq(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			klog.InfoS("Killing process left in a pod cgroup", "pid", pid, "cgroup", dir)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// deleteBridge removes the CNI bridge; it is gone already when absent.
func deleteBridge() error {
	if _, err := net.InterfaceByName(bridgeName); err != nil {
		return nil
	}
	if out, err := exec.Command("ip", "link", "delete", bridgeName).CombinedOutput(); err != nil {
		return fmt.Errorf("deleting bridge %s: %w: %s", bridgeName, err, out)
	}
	return nil
}

// killShims stops the runc shims of our containerd (identified by its
// socket on their command line): containerd leaves them running on exit,
// by design, so that containers survive a containerd restart.
func killShims(socket string) {
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) == 0 || filepath.Base(args[0]) != "containerd-shim-runc-v2" {
			continue
		}
		if !bytes.Contains(cmdline, []byte(socket)) {
			continue
		}
		klog.InfoS("Killing containerd shim", "pid", pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// killRecorded kills the process whose pid is recorded in file, if it still
// runs the binary named base (a pid may have been reused since).
func killRecorded(file, base string) {
	b, err := os.ReadFile(file)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil || filepath.Base(exe) != base {
		return
	}
	klog.InfoS("Killing process left by an earlier real node", "pid", pid, "binary", base)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for range 50 {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// wipeHost removes everything a real node leaves on the machine. It runs
// before a node starts (an earlier test binary may have died without its
// cleanup) and at teardown, after the processes are stopped.
func wipeHost(socket string) error {
	killRecorded(filepath.Join(stateDir, "kubelet.pid"), "kubelet")
	killRecorded(filepath.Join(stateDir, "containerd.pid"), "containerd")
	killShims(socket)
	var errs []error
	if err := removeKubepodsCgroups(); err != nil {
		errs = append(errs, err)
	}
	if err := deleteBridge(); err != nil {
		errs = append(errs, err)
	}
	for _, d := range []string{kubeletRoot, stateDir, podLogsDir, ctrLogsDir} {
		if err := removeTree(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
