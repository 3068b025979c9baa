package driver

import (
	"context"
	"fmt"
	"slices"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// Why a prepared claim is unprepared without the kubelet asking: the
// ResourceClaim it was prepared for is gone from the API server. The
// kubelet's own Unprepare never comes for a claim force-deleted while
// tessera-node was down (the kubelet forgets it), so without this the claim
// would hold its GPU capacity, CDI spec and MPS share forever.
const (
	// OrphanGone: no ResourceClaim of that namespace and name.
	OrphanGone = "gone"
	// OrphanReplaced: a ResourceClaim of that name with another UID.
	OrphanReplaced = "replaced"
	// OrphanDeallocated: the same claim, no longer allocated on this node.
	OrphanDeallocated = "deallocated"
)

// claimGetTimeout bounds one look-up of a claim in the API server.
const claimGetTimeout = 10 * time.Second

func (d *Driver) reconcileEvery(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.reconcileClaims(ctx)
		}
	}
}

// reconcileClaims checks every claim of the ledger (either state) against
// the API server and unprepares those it no longer has for this node (gone,
// replaced, deallocated). A first pass reads without the lock; each orphan
// it finds is read again under d.mu, so no Prepare of the same claim runs
// between the look-up that decides and the unprepare. An API error other
// than NotFound ends the pass and unprepares nothing: the next pass (every
// ReconcileInterval) tries again.
func (d *Driver) reconcileClaims(ctx context.Context) {
	logger := klog.FromContext(ctx)
	d.mu.Lock()
	refs := d.ckpt.SortedClaims()
	d.mu.Unlock()
	for _, ref := range refs {
		reason, _, err := d.claimVerdict(ctx, ref.Namespace, ref.Name, ref.UID)
		if err != nil {
			logger.Error(err, "Checking prepared claims against the API server; keeping them all until the next check", "claim", klog.KRef(ref.Namespace, ref.Name), "uid", ref.UID)
			return
		}
		if reason == "" {
			continue
		}
		if err := d.unprepareOrphan(ctx, ref.UID); err != nil {
			logger.Error(err, "Unpreparing a claim the API server no longer has for this node; retrying at the next check", "claim", klog.KRef(ref.Namespace, ref.Name), "uid", ref.UID)
		}
	}
}

// UnprepareGoneClaims runs the claim check of reconcileClaims on the claims
// of the ledger that hold any of gpus (UUIDs), now: the device plugin calls
// it when such a claim refuses an Allocate. The controller frees a GPU as
// soon as the API server no longer has its claim for this node, but the
// kubelet unprepares the claim only when it tears the pod down, seconds
// later; a device-plugin pod admitted in between would otherwise fail for
// good. Only claims the API server no longer has for this node (gone,
// replaced, deallocated: the verdict of the periodic check, read again under
// the lock) are unprepared; a claim still allocated here is kept, and any
// API error keeps them all. It returns how many it unprepared.
func (d *Driver) UnprepareGoneClaims(ctx context.Context, gpus []string) (int, error) {
	d.mu.Lock()
	var refs []*ClaimCheckpoint
	for _, cl := range d.ckpt.SortedClaims() {
		if slices.ContainsFunc(cl.Devices, func(dev DeviceCheckpoint) bool { return slices.Contains(gpus, dev.GPUUUID) }) {
			refs = append(refs, cl)
		}
	}
	d.mu.Unlock()
	n := 0
	for _, ref := range refs {
		reason, _, err := d.claimVerdict(ctx, ref.Namespace, ref.Name, ref.UID)
		if err != nil {
			return n, err
		}
		if reason == "" {
			continue
		}
		done, err := d.unprepareOrphanReported(ctx, ref.UID)
		if err != nil {
			return n, err
		}
		if done {
			n++
		}
	}
	return n, nil
}

// unprepareOrphan looks the claim up again under d.mu and, when it is still
// an orphan, undoes it and drops it from the ledger.
func (d *Driver) unprepareOrphan(ctx context.Context, uid string) error {
	_, err := d.unprepareOrphanReported(ctx, uid)
	return err
}

// unprepareOrphanReported is unprepareOrphan saying whether it unprepared
// the claim: false when the kubelet did meanwhile, or the claim is not an
// orphan after all.
func (d *Driver) unprepareOrphanReported(ctx context.Context, uid string) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	cl, ok := d.ckpt.Claims[uid]
	if !ok {
		return false, nil // the kubelet unprepared it meanwhile
	}
	reason, apiUID, err := d.claimVerdict(ctx, cl.Namespace, cl.Name, cl.UID)
	if err != nil || reason == "" {
		return false, err
	}
	if err := d.undo(ctx, cl); err != nil {
		return false, fmt.Errorf("undoing claim %s/%s: %w", cl.Namespace, cl.Name, err)
	}
	delete(d.ckpt.Claims, uid)
	if err := d.store.Save(d.ckpt); err != nil {
		// Undone but still recorded: the next check (or a restart) retries,
		// and undo is idempotent.
		d.ckpt.Claims[uid] = cl
		return false, fmt.Errorf("checkpoint after unpreparing claim %s/%s: %w", cl.Namespace, cl.Name, err)
	}
	d.ledgerChanged()
	d.metrics.orphansUnprepared.WithLabelValues(reason).Inc()
	klog.FromContext(ctx).Info("Unprepared a claim the API server no longer has for this node",
		"claim", klog.KRef(cl.Namespace, cl.Name), "uid", uid, "reason", reason, "apiUID", apiUID, "state", cl.State, "devices", len(cl.Devices))
	return true, nil
}

// claimVerdict reads the claim from the API server and says why it is an
// orphan ("" when it is not); apiUID is the UID the API server has under
// that name, if any. Only NotFound counts as gone: every other error is
// returned, and the caller keeps the claim.
func (d *Driver) claimVerdict(ctx context.Context, namespace, name, uid string) (reason, apiUID string, err error) {
	ctx, cancel := context.WithTimeout(ctx, claimGetTimeout)
	defer cancel()
	claim, err := d.opts.KubeClient.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return OrphanGone, "", nil
	case err != nil:
		return "", "", fmt.Errorf("reading ResourceClaim %s/%s: %w", namespace, name, err)
	case string(claim.UID) != uid:
		return OrphanReplaced, string(claim.UID), nil
	case !d.allocatedHere(claim):
		return OrphanDeallocated, string(claim.UID), nil
	}
	return "", string(claim.UID), nil
}

// allocatedHere says whether the claim has a device of this driver on this
// node allocated.
func (d *Driver) allocatedHere(claim *resourceapi.ResourceClaim) bool {
	if claim.Status.Allocation == nil {
		return false
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == DriverName && r.Pool == d.opts.NodeName {
			return true
		}
	}
	return false
}
