package node

import (
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/driver/drivertest"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/killpoint"
	"github.com/tessera-gpu/tessera/test/controlplane"
)

// TestClaimsGoneWhileDown: claims force-deleted, replaced (same name, new
// UID) or deallocated while tessera-node is down, one of them left half
// prepared by a kill (its MPS daemon running, known only by its pid file),
// are unprepared when tessera-node starts: CDI spec removed, MPS share
// released and the daemon told to quit with its GPU's last claim, ledger
// entry dropped, counted in a metric. A tessera-node that cannot read
// claims (an API error: here it may not get them) unprepares nothing. A
// claim deleted while tessera-node runs goes at the next periodic check.
func TestClaimsGoneWhileDown(t *testing.T) {
	ns := "orphans"
	c, client, e := kwokNode(t, "orphans-h100", "h100-sxm-8", ns)
	mk := func(name, device, memory, strategy string) *resourceapi.ResourceClaim {
		return createAllocatedClaim(t, client, drivertest.Claim(ns, name, "", []resourceapi.DeviceRequestAllocationResult{
			drivertest.Result("gpu", e.name, device, memory),
		}, drivertest.Strategy(strategy)))
	}
	gone := mk("gone", "gpu-1", "10Gi", "MPS")
	replaced := mk("replaced", "gpu-1", "10Gi", "MPS")
	deallocated := mk("deallocated", "gpu-2", "10Gi", "TimeSlicing")
	kept := mk("kept", "gpu-4", "10Gi", "MPS")
	halfDone := mk("half-done", "gpu-6", "10Gi", "MPS")

	p := e.restart(t, c.KubeconfigPath, nil)
	k := register(t, e.registrar)
	k.mustPrepare(t, gone, replaced, deallocated, kept)
	p.stop(t)
	p = e.restart(t, c.KubeconfigPath, []string{killpoint.Env + "=" + killpoint.MPSBeforePIDFile})
	p.waitOutput(t, "Test kill point armed", 30*time.Second)
	k = register(t, e.registrar)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err := k.prepare(ctx, halfDone)
	cancel()
	require.Error(t, err)
	p.killed(t, killpoint.MPSBeforePIDFile)
	require.Len(t, drivertest.Daemons(t, e.record)[gpu.FakeUUID(e.name, 6)], 1, "the half-done claim's daemon runs")

	// While tessera-node is down.
	bg := context.Background()
	claims := client.ResourceV1().ResourceClaims(ns)
	for _, name := range []string{"gone", "replaced", "half-done"} {
		require.NoError(t, claims.Delete(bg, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
	}
	newReplaced := mk("replaced", "gpu-1", "10Gi", "MPS")
	require.NotEqual(t, replaced.UID, newReplaced.UID)
	live, err := claims.Get(bg, "deallocated", metav1.GetOptions{})
	require.NoError(t, err)
	live.Status.Allocation = nil
	_, err = claims.UpdateStatus(bg, live, metav1.UpdateOptions{})
	require.NoError(t, err)
	all := []*resourceapi.ResourceClaim{gone, replaced, deallocated, kept, halfDone}

	// An API error keeps everything.
	p = e.restart(t, noClaimsKubeconfig(t, c), nil, "--device-plugin=false")
	p.waitOutput(t, "Checking prepared claims against the API server; keeping them all", 30*time.Second)
	assert.Len(t, readCheckpoint(t, e).Claims, len(all), "nothing unprepared on an API error")
	assert.Len(t, specUIDs(t, e.cdi), 4, "the prepared claims' specs stay")
	p.stop(t)

	// With the API server's answer, the orphans go at start.
	p = e.restart(t, c.KubeconfigPath, nil, "--claim-check-interval=300ms")
	k = register(t, e.registrar)
	checkNode(t, client, e, kept)
	out := p.out.String()
	for _, want := range []string{`claim="orphans/gone"`, `claim="orphans/replaced"`, `claim="orphans/deallocated"`, `claim="orphans/half-done"`} {
		assert.Regexp(t, `"Unprepared a claim the API server no longer has for this node" `+regexp.QuoteMeta(want), out)
	}
	assert.Contains(t, out, `reason="replaced" apiUID="`+string(newReplaced.UID)+`"`)
	metrics := scrapeProc(t, p)
	for reason, n := range map[string]int{driver.OrphanGone: 2, driver.OrphanReplaced: 1, driver.OrphanDeallocated: 1} {
		assert.Contains(t, metrics, fmt.Sprintf(`tessera_node_orphaned_claims_unprepared_total{reason=%q} %d`, reason, n))
	}
	rec := drivertest.Record(t, e.record)
	assert.Equal(t, 1, count(rec, "quit_"+gpu.FakeUUID(e.name, 1)), "gpu-1's daemon quit with its last claim: %v", rec)
	assert.Equal(t, 1, count(rec, "quit_"+gpu.FakeUUID(e.name, 6)), "the half-done claim's daemon quit: %v", rec)

	// While running: a deleted claim goes at the next check.
	require.NoError(t, claims.Delete(bg, "kept", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
	require.Eventually(t, func() bool { return len(readCheckpoint(t, e).Claims) == 0 }, 20*time.Second, 50*time.Millisecond)
	checkNode(t, client, e)
	p.stop(t)
}

// noClaimsKubeconfig is a kubeconfig for a tessera-node identity that may
// do everything but read ResourceClaims.
func noClaimsKubeconfig(t *testing.T, c *controlplane.ControlPlane) string {
	t.Helper()
	client := c.Client(t)
	bg := context.Background()
	const name = "tessera-node-no-claims"
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
	}}
	_, err := client.RbacV1().ClusterRoles().Create(bg, role, metav1.CreateOptions{})
	require.NoError(t, ignoreAlreadyExists(err))
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: name}},
	}
	_, err = client.RbacV1().ClusterRoleBindings().Create(bg, binding, metav1.CreateOptions{})
	require.NoError(t, ignoreAlreadyExists(err))
	return c.WriteKubeconfig(t, c.UserConfig(name))
}

// scrapeProc reads the process' /metrics (at the address it logged).
func scrapeProc(t *testing.T, p *proc) string {
	t.Helper()
	p.waitOutput(t, "Serving metrics and health", 30*time.Second)
	m := regexp.MustCompile(`"Serving metrics and health" address="([^"]+)"`).FindStringSubmatch(p.out.String())
	require.NotNil(t, m)
	return scrape(t, "http://"+m[1])
}

func ignoreAlreadyExists(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
