// Package controlplane runs a real Kubernetes control plane for tests:
// etcd, kube-apiserver, kube-controller-manager and optionally
// kube-scheduler and kwok, as child processes on free loopback ports, with a
// throwaway CA, RBAC and service-account signing. See README.md.
package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/internal/childproc"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"
)

// EnvKeep, when set to a non-empty value, keeps Dir after a passing test too.
const EnvKeep = "TESSERA_KEEP_CONTROLPLANE"

// RestrictedUser is the user of ControlPlane.RestrictedConfig. It belongs to
// no group but system:authenticated, so RBAC grants it nothing by default.
const RestrictedUser = "tessera-restricted"

const frontProxyUser = "front-proxy-client"

// ServiceCIDR is the service cluster IP range of the apiserver.
const ServiceCIDR = "10.96.0.0/16"

// DefaultFeatureGates are set on kube-apiserver, kube-controller-manager and
// kube-scheduler. DRAConsumableCapacity and DRADeviceTaints are beta and on
// by default in 1.36; they are named anyway so the harness keeps testing
// them if a default changes. DRADeviceTaintRules is beta but off by default
// (its DeviceTaintRule API is in resource.k8s.io/v1beta2, enabled through
// --runtime-config below).
var DefaultFeatureGates = map[string]bool{
	"DRAConsumableCapacity": true,
	"DRADeviceTaints":       true,
	"DRADeviceTaintRules":   true,
}

// defaultRuntimeConfig enables the API versions behind DefaultFeatureGates.
var defaultRuntimeConfig = []string{"resource.k8s.io/v1beta2=true"}

// Options select what runs. The zero value runs etcd, kube-apiserver and
// kube-controller-manager.
type Options struct {
	// FeatureGates are extra gates for apiserver, KCM and scheduler; they
	// override DefaultFeatureGates.
	FeatureGates map[string]bool
	// Scheduler also runs kube-scheduler (DRA is GA, so it allocates claims).
	Scheduler bool
	// NoControllerManager skips KCM. Start then creates the default
	// ServiceAccount and kube-root-ca.crt of namespace "default" itself.
	NoControllerManager bool

	// Workloads serves Kubernetes 1.37's gang API; the zero value serves
	// none of it, as a default 1.37 cluster does (GenericWorkload is beta
	// but off by default, and beta APIs are not served unless asked for).
	Workloads WorkloadAPI

	// RuntimeConfig entries are appended to --runtime-config, e.g.
	// "resource.k8s.io/v1alpha3=true".
	RuntimeConfig []string
	// APIServerArgs, ControllerManagerArgs and SchedulerArgs are appended to
	// the respective command lines (a later flag wins).
	APIServerArgs, ControllerManagerArgs, SchedulerArgs []string
	// BinDir overrides where the binaries come from (default: BinDir).
	BinDir string
	// StartTimeout bounds the whole start (default 3 minutes: the machines
	// running the tests are small and shared).
	StartTimeout time.Duration
}

// WorkloadAPI selects the parts of Kubernetes 1.37's workload-aware
// scheduling that the control plane serves. Any field set serves
// scheduling.k8s.io/v1beta1 (Workload, PodGroup) with the GenericWorkload
// gate on apiserver, KCM and scheduler; Options.FeatureGates still win.
type WorkloadAPI struct {
	// Serve serves scheduling.k8s.io/v1beta1 and pods' spec.schedulingGroup.
	Serve bool
	// Jobs also enables WorkloadWithJob (alpha): the Job controller creates
	// a Workload and a PodGroup for a new Job and sets its pods'
	// spec.schedulingGroup (a Job's spec.scheduling picks gang or basic).
	Jobs bool
	// PreemptionPolicy also enables PodGroupPreemptionPolicy (alpha):
	// PodGroup.spec.preemptionPolicy is accepted.
	PreemptionPolicy bool
}

// WorkloadRuntimeConfig is the --runtime-config entry that serves the
// workload API (Workload and PodGroup of scheduling.k8s.io/v1beta1).
const WorkloadRuntimeConfig = "scheduling.k8s.io/v1beta1=true"

func (w WorkloadAPI) served() bool { return w.Serve || w.Jobs || w.PreemptionPolicy }

// gates are the feature gates w needs.
func (w WorkloadAPI) gates() map[string]bool {
	g := map[string]bool{}
	if w.served() {
		g["GenericWorkload"] = true
	}
	if w.Jobs {
		g["WorkloadWithJob"] = true
	}
	if w.PreemptionPolicy {
		g["PodGroupPreemptionPolicy"] = true
	}
	return g
}

// runtimeConfig is every --runtime-config entry: the defaults, the workload
// API's, then Options.RuntimeConfig (a later entry wins).
func (cp *ControlPlane) runtimeConfig() string {
	rc := slices.Clone(defaultRuntimeConfig)
	if cp.opts.Workloads.served() {
		rc = append(rc, WorkloadRuntimeConfig)
	}
	return strings.Join(append(rc, cp.opts.RuntimeConfig...), ",")
}

// ControlPlane is a running control plane. Its fields are read-only.
type ControlPlane struct {
	Dir              string       // working dir (certs, logs, data)
	AdminConfig      *rest.Config // system:masters
	RestrictedConfig *rest.Config // RestrictedUser, no RBAC grants unless a test adds them
	KubeconfigPath   string       // admin kubeconfig file, for child processes
	APIServerURL     string

	// CAFile is the PEM CA that signed the apiserver's serving cert and
	// every client cert; CAKeyFile its key (also KCM's cluster-signing key).
	CAFile, CAKeyFile string
	// ServiceAccountKeyFile is the private key that signs service-account
	// tokens; ServiceAccountIssuer the issuer they carry.
	ServiceAccountKeyFile, ServiceAccountIssuer string

	opts   Options
	bin    string
	ca     *authority
	logf   func(format string, args ...any)
	mu     sync.Mutex
	procs  []*process // in start order
	kwok   *process
	nfiles int
	// extraSchedulers numbers the kube-schedulers StartKubeScheduler runs.
	extraSchedulers int
	stopped         bool
	// apiArgs are kube-apiserver's flags, kept so RestartAPIServer starts it
	// again exactly as before (same port, etcd, certificates).
	apiArgs []string
	// apiDown is set while StopAPIServer has it stopped.
	apiDown bool
	// children numbers the processes StartChild runs, by name.
	children map[string]int
}

// Start runs a control plane for t and stops it at t's cleanup. It skips the
// test under -short and fails it, with the components' log tails, when the
// control plane does not come up.
func Start(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	if opts.BinDir == "" {
		opts.BinDir = BinDir(t)
	} else if testing.Short() {
		t.Skip(shortSkipReason)
	}
	cp, err := New(opts, t.Logf)
	if err != nil {
		t.Fatalf("starting control plane: %v", err)
	}
	t.Cleanup(func() { cp.Stop(t.Failed()) })
	return cp
}

// New starts a control plane without a testing.TB (e.g. one shared by a
// package from TestMain); the caller must call Stop. logf receives progress
// and, on failure, the log tails; nil means klog.
func New(opts Options, logf func(format string, args ...any)) (*ControlPlane, error) {
	if logf == nil {
		logf = func(format string, args ...any) { klog.InfoDepth(1, fmt.Sprintf(format, args...)) }
	}
	if opts.BinDir == "" {
		dir, err := FindBinDir()
		if err != nil {
			return nil, err
		}
		opts.BinDir = dir
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 3 * time.Minute
	}
	var err error
	// Another test binary may grab one of our probed ports before our
	// child binds it; then a fresh start on fresh ports is the cure.
	for attempt := 1; attempt <= 3; attempt++ {
		var cp *ControlPlane
		cp, err = launch(opts, logf)
		if err == nil {
			return cp, nil
		}
		if !errors.Is(err, errPortTaken) {
			break
		}
		logf("control plane: %v; retrying on other ports", err)
	}
	return nil, err
}

var errPortTaken = errors.New("a port was taken by another process")

func launch(opts Options, logf func(string, ...any)) (cp *ControlPlane, err error) {
	began := time.Now()
	dir, err := os.MkdirTemp("", "tessera-cp-")
	if err != nil {
		return nil, fmt.Errorf("creating working dir: %w", err)
	}
	cp = &ControlPlane{Dir: dir, opts: opts, bin: opts.BinDir, logf: logf}
	defer func() {
		if err != nil {
			cp.Stop(!errors.Is(err, errPortTaken))
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), opts.StartTimeout)
	defer cancel()

	if err := cp.writePKI(); err != nil {
		return cp, err
	}
	var ports portAllocator
	defer ports.release()
	var etcdPort, peerPort, apiPort, kcmPort, schedPort int
	for _, p := range []*int{&etcdPort, &peerPort, &apiPort, &kcmPort, &schedPort} {
		if *p, err = ports.get(); err != nil {
			return cp, err
		}
	}
	ports.release() // the children bind them now
	cp.APIServerURL = "https://127.0.0.1:" + strconv.Itoa(apiPort)

	if err := cp.startEtcd(ctx, etcdPort, peerPort); err != nil {
		return cp, err
	}
	if err := cp.startAPIServer(ctx, etcdPort, apiPort); err != nil {
		return cp, err
	}
	if !opts.NoControllerManager {
		if err := cp.startControllerManager(ctx, kcmPort); err != nil {
			return cp, err
		}
	}
	if opts.Scheduler {
		if err := cp.startScheduler(ctx, schedPort); err != nil {
			return cp, err
		}
	}
	if err := cp.waitDefaultNamespace(ctx); err != nil {
		return cp, err
	}
	logf("control plane up in %s at %s (dir %s)", time.Since(began).Round(100*time.Millisecond), cp.APIServerURL, dir)
	return cp, nil
}

// writePKI creates the CA, the apiserver's certs, the service-account key
// and the admin and restricted client configs.
func (cp *ControlPlane) writePKI() error {
	ca, err := newAuthority()
	if err != nil {
		return err
	}
	cp.ca = ca
	serving, servingKey, err := ca.issue("kube-apiserver", nil, true,
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		append(hostIPs(), net.ParseIP("10.96.0.1")))
	if err != nil {
		return err
	}
	// The apiserver's identity towards kubelets (logs, exec, port-forward).
	kubeletClient, kubeletClientKey, err := ca.issue("kube-apiserver-kubelet-client", []string{"system:masters"}, false, nil, nil)
	if err != nil {
		return err
	}
	// The front-proxy identity, so aggregated API servers (and the
	// components' delegated authentication) find a request-header CA.
	proxyClient, proxyClientKey, err := ca.issue(frontProxyUser, nil, false, nil, nil)
	if err != nil {
		return err
	}
	saKey, saPub, err := newServiceAccountKey()
	if err != nil {
		return err
	}
	cp.CAFile = cp.path("ca.crt")
	cp.CAKeyFile = cp.path("ca.key")
	cp.ServiceAccountKeyFile = cp.path("sa.key")
	cp.ServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"
	return writeFiles(map[string][]byte{
		cp.CAFile:                         ca.certPEM,
		cp.CAKeyFile:                      ca.keyPEM,
		cp.path("apiserver.crt"):          serving,
		cp.path("apiserver.key"):          servingKey,
		cp.path("kubelet-client.crt"):     kubeletClient,
		cp.path("kubelet-client.key"):     kubeletClientKey,
		cp.path("front-proxy-client.crt"): proxyClient,
		cp.path("front-proxy-client.key"): proxyClientKey,
		cp.ServiceAccountKeyFile:          saKey,
		cp.path("sa.pub"):                 saPub,
	})
}

func (cp *ControlPlane) path(name string) string { return filepath.Join(cp.Dir, name) }

func (cp *ControlPlane) startEtcd(ctx context.Context, port, peerPort int) error {
	client := "http://127.0.0.1:" + strconv.Itoa(port)
	peer := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	p, err := cp.start("etcd", "etcd",
		"--name=default",
		"--data-dir="+cp.path("etcd-data"),
		"--listen-client-urls="+client,
		"--advertise-client-urls="+client,
		"--listen-peer-urls="+peer,
		"--initial-advertise-peer-urls="+peer,
		"--initial-cluster=default="+peer,
		// Test data is thrown away; fsync only costs time on a shared disk.
		"--unsafe-no-fsync=true",
	)
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	return cp.waitFor(ctx, "etcd to be healthy", []*process{p}, func() (bool, error) {
		resp, err := hc.Get(client + "/health")
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

func (cp *ControlPlane) startAPIServer(ctx context.Context, etcdPort, port int) error {
	args := []string{
		"--etcd-servers=http://127.0.0.1:" + strconv.Itoa(etcdPort),
		"--bind-address=127.0.0.1",
		// A loopback address cannot be an Endpoints address, so the
		// "kubernetes" Service gets no endpoints; nothing here needs them.
		"--advertise-address=127.0.0.1",
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + cp.path("apiserver-certs"),
		"--tls-cert-file=" + cp.path("apiserver.crt"),
		"--tls-private-key-file=" + cp.path("apiserver.key"),
		"--client-ca-file=" + cp.CAFile,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=" + cp.ServiceAccountIssuer,
		"--service-account-key-file=" + cp.path("sa.pub"),
		"--service-account-signing-key-file=" + cp.ServiceAccountKeyFile,
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--allow-privileged=true",
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-client-certificate=" + cp.path("kubelet-client.crt"),
		"--kubelet-client-key=" + cp.path("kubelet-client.key"),
		"--requestheader-client-ca-file=" + cp.CAFile,
		"--requestheader-allowed-names=" + frontProxyUser,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-uid-headers=X-Remote-Uid",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + cp.path("front-proxy-client.crt"),
		"--proxy-client-key-file=" + cp.path("front-proxy-client.key"),
		"--runtime-config=" + cp.runtimeConfig(),
		"--feature-gates=" + cp.featureGates(),
		"--profiling=false",
		"--v=1",
	}
	cp.apiArgs = append(args, cp.opts.APIServerArgs...)
	cp.AdminConfig = cp.UserConfig("tessera-admin", "system:masters")
	cp.RestrictedConfig = cp.UserConfig(RestrictedUser)
	var err error
	if cp.KubeconfigPath, err = cp.writeKubeconfig("admin.kubeconfig", cp.AdminConfig); err != nil {
		return err
	}
	p, err := cp.start("kube-apiserver", "kube-apiserver", cp.apiArgs...)
	if err != nil {
		return err
	}
	return cp.waitAPIServerReady(ctx, p)
}

// waitAPIServerReady waits for kube-apiserver's /readyz.
func (cp *ControlPlane) waitAPIServerReady(ctx context.Context, p *process) error {
	client, err := kubernetes.NewForConfig(cp.AdminConfig)
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	return cp.waitFor(ctx, "kube-apiserver /readyz", []*process{p}, func() (bool, error) {
		var status int
		client.Discovery().RESTClient().Get().AbsPath("/readyz").Timeout(5 * time.Second).Do(ctx).StatusCode(&status)
		return status == http.StatusOK, nil
	})
}

func (cp *ControlPlane) startControllerManager(ctx context.Context, port int) error {
	kubeconfig, err := cp.writeKubeconfig("kube-controller-manager.kubeconfig", cp.UserConfig("system:kube-controller-manager"))
	if err != nil {
		return err
	}
	args := append(cp.componentArgs(kubeconfig, port),
		"--cert-dir="+cp.path("kcm-certs"),
		"--controllers=*",
		"--root-ca-file="+cp.CAFile,
		"--service-account-private-key-file="+cp.ServiceAccountKeyFile,
		"--use-service-account-credentials=true",
		"--cluster-signing-cert-file="+cp.CAFile,
		"--cluster-signing-key-file="+cp.CAKeyFile,
		"--service-cluster-ip-range="+ServiceCIDR,
	)
	p, err := cp.start("kube-controller-manager", "kube-controller-manager", append(args, cp.opts.ControllerManagerArgs...)...)
	if err != nil {
		return err
	}
	return cp.waitHealthz(ctx, p, port)
}

// componentArgs are the flags kube-controller-manager and kube-scheduler
// share: their identity, a secure port on loopback, no leader election, the
// harness's feature gates.
func (cp *ControlPlane) componentArgs(kubeconfig string, port int) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--leader-elect=false",
		"--feature-gates=" + cp.featureGates(),
		"--profiling=false",
		"--v=1",
	}
}

func (cp *ControlPlane) startScheduler(ctx context.Context, port int) error {
	kubeconfig, err := cp.writeKubeconfig("kube-scheduler.kubeconfig", cp.UserConfig("system:kube-scheduler"))
	if err != nil {
		return err
	}
	args := cp.componentArgs(kubeconfig, port)
	p, err := cp.start("kube-scheduler", "kube-scheduler", append(args, cp.opts.SchedulerArgs...)...)
	if err != nil {
		return err
	}
	return cp.waitHealthz(ctx, p, port)
}

// StartKubeScheduler starts a kube-scheduler on the running control plane,
// for a test that needs one later than New starts it (Options.Scheduler):
// the harness's flags with args appended (later flags win). It returns once
// /healthz answers; stop ends it (Stop ends it too, if still running).
func (cp *ControlPlane) StartKubeScheduler(ctx context.Context, args ...string) (stop func(), err error) {
	var ports portAllocator
	port, err := ports.get()
	ports.release()
	if err != nil {
		return nil, err
	}
	cp.mu.Lock()
	cp.extraSchedulers++
	name := fmt.Sprintf("kube-scheduler-%d", cp.extraSchedulers)
	cp.mu.Unlock()
	kubeconfig, err := cp.writeKubeconfig(name+".kubeconfig", cp.UserConfig("system:kube-scheduler"))
	if err != nil {
		return nil, err
	}
	p, err := cp.start(name, "kube-scheduler", append(cp.componentArgs(kubeconfig, port), args...)...)
	if err != nil {
		return nil, err
	}
	stop = func() {
		cp.mu.Lock()
		cp.procs = slices.DeleteFunc(cp.procs, func(q *process) bool { return q == p })
		cp.mu.Unlock()
		p.Stop(10 * time.Second)
	}
	if err := cp.waitHealthz(ctx, p, port); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// waitHealthz polls a component's /healthz, which is served without
// authentication. The component serves a self-signed cert.
func (cp *ControlPlane) waitHealthz(ctx context.Context, p *process, port int) error {
	hc := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // self-signed loopback test server
	}
	url := "https://127.0.0.1:" + strconv.Itoa(port) + "/healthz"
	return cp.waitFor(ctx, p.Name+" /healthz", []*process{p}, func() (bool, error) {
		resp, err := hc.Get(url)
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// waitDefaultNamespace waits for what pods in namespace "default" need: the
// default ServiceAccount (the ServiceAccount admission plugin rejects pods
// without it) and the kube-root-ca.crt ConfigMap (their token volume). KCM
// creates both; without KCM the harness creates them.
func (cp *ControlPlane) waitDefaultNamespace(ctx context.Context) error {
	client, err := kubernetes.NewForConfig(cp.AdminConfig)
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	const ns = metav1.NamespaceDefault
	if cp.opts.NoControllerManager {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
		if _, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating default ServiceAccount: %w", err)
		}
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt"},
			Data:       map[string]string{"ca.crt": string(cp.ca.certPEM)},
		}
		if _, err := client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating kube-root-ca.crt: %w", err)
		}
	}
	return cp.waitFor(ctx, "the default ServiceAccount and kube-root-ca.crt", cp.running(), func() (bool, error) {
		if _, err := client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return false, nil
		}
		_, err := client.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, nil
	})
}

// start launches one of the binaries and records it for Stop.
func (cp *ControlPlane) start(name, binary string, args ...string) (*process, error) {
	return cp.startEnv(name, binary, nil, args...)
}

func (cp *ControlPlane) startEnv(name, binary string, env []string, args ...string) (*process, error) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.stopped {
		return nil, fmt.Errorf("starting %s: control plane already stopped", name)
	}
	p, err := childproc.Start(cp.Dir, name, filepath.Join(cp.bin, binary), args, env)
	if err != nil {
		return nil, err
	}
	cp.procs = append(cp.procs, p)
	return p, nil
}

func (cp *ControlPlane) running() []*process {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return slices.Clone(cp.procs)
}

// waitFor polls cond until it holds, ctx ends, or one of procs exits (then
// the error carries that process's log tail).
func (cp *ControlPlane) waitFor(ctx context.Context, what string, procs []*process, cond func() (bool, error)) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, p := range procs {
			if done, werr := p.Exited(); done {
				if addrInUse(p) {
					return fmt.Errorf("%s: %w", p.Name, errPortTaken)
				}
				return fmt.Errorf("waiting for %s: %s exited (%v): %w; last lines of %s:\n%s",
					what, p.Name, werr, errExited, p.LogPath, p.Tail(40))
			}
		}
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			var b strings.Builder
			for _, p := range procs {
				fmt.Fprintf(&b, "\nlast lines of %s:\n%s", p.LogPath, p.Tail(20))
			}
			return fmt.Errorf("timed out waiting for %s: %w%s", what, ctx.Err(), b.String())
		case <-tick.C:
		}
	}
}

func (cp *ControlPlane) featureGates() string {
	gates := maps.Clone(DefaultFeatureGates)
	maps.Copy(gates, cp.opts.Workloads.gates())
	maps.Copy(gates, cp.opts.FeatureGates)
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(gates)) {
		parts = append(parts, name+"="+strconv.FormatBool(gates[name]))
	}
	return strings.Join(parts, ",")
}

// Stop stops every process (SIGTERM, then SIGKILL after a grace period),
// newest first. When failed is set, or $TESSERA_KEEP_CONTROLPLANE is set, it
// keeps Dir and logs the tail of each component's log; else it removes Dir.
// Stop is idempotent.
func (cp *ControlPlane) Stop(failed bool) {
	cp.mu.Lock()
	if cp.stopped {
		cp.mu.Unlock()
		return
	}
	cp.stopped = true
	procs := slices.Clone(cp.procs)
	cp.mu.Unlock()

	var wg sync.WaitGroup
	// Clients (kwok, scheduler, KCM) go first, in parallel; then the
	// apiserver, then etcd, so nothing logs errors about a vanished server.
	for i := len(procs) - 1; i >= 0; i-- {
		p := procs[i]
		if p.Name == "kube-apiserver" || p.Name == "etcd" {
			wg.Wait()
			p.Stop(15 * time.Second)
			continue
		}
		wg.Go(func() { p.Stop(10 * time.Second) })
	}
	wg.Wait()

	if failed {
		for _, p := range procs {
			cp.logf("---- last lines of %s ----\n%s", p.LogPath, p.Tail(12))
		}
	}
	keep := os.Getenv(EnvKeep) != ""
	if failed && !keep {
		// etcd's data (a 64 MB preallocated WAL) rarely helps a post-mortem
		// and would fill /tmp over many failing runs; the logs stay.
		_ = os.RemoveAll(cp.path("etcd-data"))
	}
	if failed || keep {
		cp.logf("control plane stopped; kept its dir %s (certs, kubeconfigs, logs)", cp.Dir)
		return
	}
	if err := os.RemoveAll(cp.Dir); err != nil {
		cp.logf("removing control-plane dir: %v", err)
	}
}

// Client returns a clientset for the admin.
func (cp *ControlPlane) Client(t testing.TB) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(cp.AdminConfig)
	if err != nil {
		t.Fatalf("admin clientset: %v", err)
	}
	return c
}

// UserConfig returns a config that authenticates as user in groups with a
// fresh client cert from the harness CA. Every authenticated user is also in
// system:authenticated.
func (cp *ControlPlane) UserConfig(user string, groups ...string) *rest.Config {
	certPEM, keyPEM, err := cp.ca.issue(user, groups, false, nil, nil)
	if err != nil {
		// Only crypto/rand failing gets here; there is nothing to recover.
		panic(fmt.Errorf("client cert for %q: %w", user, err))
	}
	return &rest.Config{
		Host: cp.APIServerURL,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   cp.ca.certPEM,
			CertData: certPEM,
			KeyData:  keyPEM,
		},
		// Tests create objects in bursts; client-side throttling would
		// only slow them down.
		QPS:   500,
		Burst: 1000,
	}
}

// WriteKubeconfig writes cfg as a kubeconfig file in Dir and returns its
// path, for child processes that take --kubeconfig.
func (cp *ControlPlane) WriteKubeconfig(t testing.TB, cfg *rest.Config) string {
	t.Helper()
	cp.mu.Lock()
	cp.nfiles++
	name := fmt.Sprintf("kubeconfig-%d", cp.nfiles)
	cp.mu.Unlock()
	path, err := cp.writeKubeconfig(name, cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return path
}

func (cp *ControlPlane) writeKubeconfig(name string, cfg *rest.Config) (string, error) {
	const ctxName = "tessera"
	caData := cfg.CAData
	if len(caData) == 0 && cfg.CAFile == "" {
		caData = cp.ca.certPEM
	}
	host := cfg.Host
	if host == "" {
		host = cp.APIServerURL
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters[ctxName] = &clientcmdapi.Cluster{
		Server:                   host,
		CertificateAuthority:     cfg.CAFile,
		CertificateAuthorityData: caData,
		TLSServerName:            cfg.ServerName,
	}
	kc.AuthInfos[ctxName] = &clientcmdapi.AuthInfo{
		ClientCertificate:     cfg.CertFile,
		ClientCertificateData: cfg.CertData,
		ClientKey:             cfg.KeyFile,
		ClientKeyData:         cfg.KeyData,
		Token:                 cfg.BearerToken,
		TokenFile:             cfg.BearerTokenFile,
		Impersonate:           cfg.Impersonate.UserName,
		ImpersonateUID:        cfg.Impersonate.UID,
		ImpersonateGroups:     cfg.Impersonate.Groups,
		ImpersonateUserExtra:  cfg.Impersonate.Extra,
	}
	kc.Contexts[ctxName] = &clientcmdapi.Context{Cluster: ctxName, AuthInfo: ctxName}
	kc.CurrentContext = ctxName
	path := cp.path(name)
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return path, nil
}
