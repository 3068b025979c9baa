package driver

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/draname"
)

// Multi-node NVLink: a DRA constraint (matchAttribute on AttrClique) keeps
// the GPUs of one claim in one clique, but a gang's pods are many claims
// on many nodes, so keeping them in one clique is the scheduler's job. It
// reads node labels (a Topology level), so the node is labelled with its
// GPUs' clique, as NVIDIA's GPU feature discovery labels it.

// nodeClique is the clique every GPU of the node that has one agrees on;
// "" when none has one, or when they disagree (logged: no level can hold
// such a node whole).
func nodeClique(logger klog.Logger, devs []gpu.Device) string {
	clique := ""
	for _, g := range devs {
		switch {
		case g.Clique == "" || g.Clique == clique:
		case clique == "":
			clique = g.Clique
		default:
			logger.Info("GPUs of this node are in different NVLink cliques; the node is not labelled", "label", draname.LabelClique, "clique", clique, "other", g.Clique, "gpu", g.UUID)
			return ""
		}
	}
	return clique
}

// labelClique sets the node's clique label, retrying with backoff until
// it is written or ctx ends: the node may not be registered yet, and the
// API server may be away.
func (d *Driver) labelClique(ctx context.Context, clique string) {
	logger := klog.FromContext(ctx).WithValues("node", d.opts.NodeName, "label", draname.LabelClique, "clique", clique)
	backoff := wait.Backoff{Duration: time.Second, Factor: 2, Steps: 1 << 30, Cap: time.Minute}
	err := wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
		if err := setNodeLabel(ctx, d, clique); err != nil {
			logger.Error(err, "Labelling the node with its NVLink clique; retrying")
			return false, nil
		}
		return true, nil
	})
	if err == nil {
		logger.Info("Labelled the node with its NVLink clique")
	}
}

// setNodeLabel writes the clique label by a merge patch, unless the node
// carries that value already (GPU feature discovery may have written it).
func setNodeLabel(ctx context.Context, d *Driver, clique string) error {
	nodes := d.opts.KubeClient.CoreV1().Nodes()
	n, err := nodes.Get(ctx, d.opts.NodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading node %s: %w", d.opts.NodeName, err)
	}
	if n.Labels[draname.LabelClique] == clique {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{draname.LabelClique: clique}}})
	if err != nil {
		return err
	}
	if _, err := nodes.Patch(ctx, d.opts.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("labelling node %s: %w", d.opts.NodeName, err)
	}
	return nil
}
