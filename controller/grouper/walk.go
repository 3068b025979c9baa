package grouper

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	v1 "k8s.io/api/core/v1"
)

// maxDepth bounds the owner walk (an LWS worker pod is four steps from its
// LeaderWorkerSet; a cycle of owner references must not loop forever).
const maxDepth = 8

// link is one owner on a pod's way up.
type link struct {
	gk   schema.GroupKind
	info kindInfo
	obj  *unstructured.Unstructured
}

// walk follows controller owner references from pod up while the owner is
// a kind the grouper knows; the chain runs from the pod's controller to the
// highest known owner. An owner that cannot be read is an error (retried).
func (g *Grouper) walk(ctx context.Context, pod *v1.Pod) ([]link, error) {
	var chain []link
	ref := metav1.GetControllerOf(pod)
	for depth := 0; ref != nil && depth < maxDepth; depth++ {
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err != nil {
			return chain, nil
		}
		gk := schema.GroupKind{Group: gv.Group, Kind: ref.Kind}
		info, known := kinds[gk]
		if !known {
			break
		}
		obj, err := g.owner(ctx, gv.WithResource(info.resource), pod.Namespace, ref)
		if err != nil {
			return chain, err
		}
		chain = append(chain, link{gk: gk, info: info, obj: obj})
		ref = controllerOf(obj)
	}
	return chain, nil
}

func controllerOf(obj *unstructured.Unstructured) *metav1.OwnerReference {
	for _, r := range obj.GetOwnerReferences() {
		if r.Controller != nil && *r.Controller {
			return &r
		}
	}
	return nil
}

// owner reads an owner from its kind's informer (started the first time it
// is needed), else from the API server (an owner created a moment ago may
// not be in the cache yet). The UID must be the reference's: a namesake
// made after the owner was deleted is not the pod's owner.
func (g *Grouper) owner(ctx context.Context, gvr schema.GroupVersionResource, ns string, ref *metav1.OwnerReference) (*unstructured.Unstructured, error) {
	what := fmt.Sprintf("%s %s/%s", ref.Kind, ns, ref.Name)
	if gvr.Group == "" && gvr.Resource == "pods" {
		// A pod owning pods (an LWS leader): ours, in our own cache.
		if p, err := g.pods.Pods(ns).Get(ref.Name); err == nil && p.UID == ref.UID {
			m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
			return &unstructured.Unstructured{Object: m}, nil
		}
	} else if inf := g.ownerInformer(ctx, gvr); inf != nil {
		if obj, ok, _ := inf.GetIndexer().GetByKey(ns + "/" + ref.Name); ok {
			if u, isU := obj.(*unstructured.Unstructured); isU && u.GetUID() == ref.UID {
				return u, nil
			}
		}
	}
	u, err := g.opts.Dynamic.Resource(gvr).Namespace(ns).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("its owner %s does not exist", what)
	case err != nil:
		return nil, fmt.Errorf("reading its owner %s: %w", what, err)
	case u.GetUID() != ref.UID:
		return nil, fmt.Errorf("its owner %s was replaced (uid %s, not %s)", what, u.GetUID(), ref.UID)
	}
	return u, nil
}

// ownerSyncWait is how long a newly started owner informer may take to
// list before a walk reads the API server directly instead.
const ownerSyncWait = 5 * time.Second

// ownerInformer returns the informer of an owner kind, starting it the
// first time; nil while it has not synced (the CRD is not installed, RBAC
// does not allow it): the walk then reads the API server.
func (g *Grouper) ownerInformer(ctx context.Context, gvr schema.GroupVersionResource) cache.SharedIndexInformer {
	g.mu.Lock()
	inf, ok := g.owners[gvr]
	if !ok {
		inf = dynamicinformer.NewFilteredDynamicInformer(g.opts.Dynamic, gvr, "", 0, cache.Indexers{}, nil).Informer()
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			UpdateFunc: func(_, obj any) { g.ownerChanged(obj) },
		})
		g.owners[gvr] = inf
		runCtx := g.runCtx
		if runCtx == nil {
			runCtx = ctx
		}
		go inf.RunWithContext(runCtx)
		klog.FromContext(ctx).V(2).Info("Watching an owner kind", "resource", gvr.String())
	}
	g.mu.Unlock()
	if inf.HasSynced() {
		return inf
	}
	syncCtx, cancel := context.WithTimeout(ctx, ownerSyncWait)
	defer cancel()
	if cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced) {
		return inf
	}
	return nil
}
