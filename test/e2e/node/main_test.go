// Package node tests tessera-node's DRA plugin against a real control plane
// (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok
// nodes), playing the kubelet over the plugin's real unix sockets.
package node

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/driver/deviceclasses"
	"github.com/tessera-gpu/tessera/driver/drivertest"
	"github.com/tessera-gpu/tessera/test/controlplane"
)

// shared is the package's control plane (with kube-scheduler and kwok, and
// the DeviceClasses applied).
var shared = &controlplane.Shared{Options: controlplane.Options{Scheduler: true}, Kwok: true,
	Setup: func(cp *controlplane.ControlPlane, t testing.TB) error {
		classes, err := deviceclasses.Load()
		if err != nil {
			return err
		}
		client := cp.Client(t)
		for _, dc := range classes {
			if _, err := client.ResourceV1().DeviceClasses().Create(context.Background(), dc, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("applying DeviceClass %s: %w", dc.Name, err)
			}
		}
		return nil
	}}

// TestMain stops the control plane shared by the package's tests.
func TestMain(m *testing.M) { os.Exit(shared.Run(m)) }

// cluster returns the package's control plane, starting it on first use.
func cluster(t testing.TB) *controlplane.ControlPlane {
	t.Helper()
	return shared.Get(t)
}

// shortTempDir is a temp dir with a short path: unix socket paths are
// limited to 108 bytes, and t.TempDir() paths carry the test name.
func shortTempDir(t testing.TB) string { return drivertest.ShortTempDir(t) }

// kubelet plays the kubelet's side of a plugin: registration, then DRA calls.
type kubelet struct {
	dra drapb.DRAPluginClient
}

func dial(t testing.TB, socket string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// waitSocket waits until a unix socket exists.
func waitSocket(t testing.TB, path string, timeout time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := os.Stat(path)
		return err == nil
	}, timeout, 20*time.Millisecond, "socket %s", path)
}

// register does what the kubelet's plugin watcher does with a new socket in
// the registry directory: GetInfo, then NotifyRegistrationStatus; it
// returns a client of the DRA endpoint the plugin named.
func register(t testing.TB, registrarDir string) *kubelet {
	t.Helper()
	regSocket := filepath.Join(registrarDir, "gpu.tessera.dev-reg.sock")
	waitSocket(t, regSocket, 30*time.Second)
	reg := registerapi.NewRegistrationClient(dial(t, regSocket))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The socket file exists from bind() on, a moment before listen():
	// wait for the server rather than fail on a refused connection.
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
	require.NoError(t, err)
	require.Equal(t, registerapi.DRAPlugin, info.Type)
	require.Equal(t, "gpu.tessera.dev", info.Name)
	require.Contains(t, info.SupportedVersions, drapb.DRAPluginService)
	_, err = reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true})
	require.NoError(t, err)
	return &kubelet{dra: drapb.NewDRAPluginClient(dial(t, info.Endpoint))}
}

// direct is a kubelet that skips registration and talks to a DRA socket.
func direct(t testing.TB, socket string) *kubelet {
	t.Helper()
	waitSocket(t, socket, 30*time.Second)
	return &kubelet{dra: drapb.NewDRAPluginClient(dial(t, socket))}
}

func pbClaim(c *resourceapi.ResourceClaim) *drapb.Claim {
	return &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
}

// prepare calls NodePrepareResources for claims and returns the per-claim
// responses.
func (k *kubelet) prepare(ctx context.Context, claims ...*resourceapi.ResourceClaim) (map[string]*drapb.NodePrepareResourceResponse, error) {
	req := &drapb.NodePrepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, pbClaim(c))
	}
	resp, err := k.dra.NodePrepareResources(ctx, req, grpc.WaitForReady(true))
	if err != nil {
		return nil, err
	}
	return resp.Claims, nil
}

func (k *kubelet) mustPrepare(t testing.TB, claims ...*resourceapi.ResourceClaim) map[string]*drapb.NodePrepareResourceResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := k.prepare(ctx, claims...)
	require.NoError(t, err)
	for _, c := range claims {
		require.Contains(t, res, string(c.UID))
		require.Empty(t, res[string(c.UID)].Error, "claim %s", c.Name)
	}
	return res
}

func (k *kubelet) mustUnprepare(t testing.TB, claims ...*resourceapi.ResourceClaim) {
	t.Helper()
	req := &drapb.NodeUnprepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, pbClaim(c))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := k.dra.NodeUnprepareResources(ctx, req, grpc.WaitForReady(true))
	require.NoError(t, err)
	for _, c := range claims {
		require.Empty(t, resp.Claims[string(c.UID)].GetError(), "claim %s", c.Name)
	}
}

// readSpec reads the CDI spec of a claim.
func readSpec(t testing.TB, cdiRoot, claimUID string) *cdispec.Spec {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(cdiRoot, "gpu.tessera.dev-claim_"+claimUID+".json"))
	require.NoError(t, err)
	var s cdispec.Spec
	require.NoError(t, json.Unmarshal(data, &s))
	return &s
}

// envOf is the env of a spec's only device, as a map.
func envOf(t testing.TB, s *cdispec.Spec) map[string]string {
	t.Helper()
	require.Len(t, s.Devices, 1)
	env := map[string]string{}
	for _, kv := range s.Devices[0].ContainerEdits.Env {
		k, v, _ := cut(kv, "=")
		env[k] = v
	}
	return env
}

func cut(s, sep string) (string, string, bool) {
	for i := 0; i+len(sep) <= len(s); i++ {
		if s[i:i+len(sep)] == sep {
			return s[:i], s[i+len(sep):], true
		}
	}
	return s, "", false
}

// nodeSlices lists the driver's ResourceSlices of a node.
func nodeSlices(ctx context.Context, client kubernetes.Interface, node string) ([]resourceapi.ResourceSlice, error) {
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + node + "," + resourceapi.ResourceSliceSelectorDriver + "=gpu.tessera.dev",
	})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// waitSlices waits until cond holds for the node's slices and returns them.
func waitSlices(t testing.TB, client kubernetes.Interface, node string, timeout time.Duration, cond func([]resourceapi.ResourceSlice) bool) []resourceapi.ResourceSlice {
	t.Helper()
	var got []resourceapi.ResourceSlice
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		s, err := nodeSlices(ctx, client, node)
		if err != nil {
			return false, nil
		}
		got = s
		return cond(s), nil
	})
	require.NoError(t, err, "waiting for the ResourceSlices of %s; last seen: %d slices", node, len(got))
	return got
}

// createAllocatedClaim creates a claim and writes its allocation directly
// (as a scheduler would), for tests that need no pod.
func createAllocatedClaim(t testing.TB, client kubernetes.Interface, claim *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	t.Helper()
	ctx := context.Background()
	alloc := claim.Status.Allocation
	claim = claim.DeepCopy()
	claim.UID = ""
	claim.Status = resourceapi.ResourceClaimStatus{}
	if len(claim.Spec.Devices.Requests) == 0 {
		seen := map[string]bool{}
		for _, r := range alloc.Devices.Results {
			if seen[r.Request] {
				continue
			}
			seen[r.Request] = true
			claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, resourceapi.DeviceRequest{
				Name:    r.Request,
				Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev"},
			})
		}
	}
	created, err := client.ResourceV1().ResourceClaims(claim.Namespace).Create(ctx, claim, metav1.CreateOptions{})
	require.NoError(t, err)
	created.Status.Allocation = alloc
	updated, err := client.ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	require.NoError(t, err)
	return updated
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func readSpecErr(cdiRoot, claimUID string) ([]byte, error) {
	return os.ReadFile(filepath.Join(cdiRoot, "gpu.tessera.dev-claim_"+claimUID+".json"))
}
