package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// ownerWatch follows the DaemonSet that runs tessera-node (--daemonset) to
// tell an uninstall from an upgrade at shutdown: both stop the container
// with SIGTERM, but only an uninstall deletes the DaemonSet. It watches from
// the start because by the time the pod is stopped the uninstall may have
// deleted tessera-node's RBAC and ServiceAccount too, and a fresh request
// could no longer say.
type ownerWatch struct {
	client    kubernetes.Interface
	namespace string
	name      string
	deleted   atomic.Bool
}

// parseDaemonSetRef parses --daemonset's <namespace>/<name>.
func parseDaemonSetRef(ref string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(ref, "/")
	if !ok || namespace == "" || name == "" {
		return "", "", fmt.Errorf("--daemonset %q: want <namespace>/<name>", ref)
	}
	for what, v := range map[string]string{"namespace": namespace, "name": name} {
		if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
			return "", "", fmt.Errorf("--daemonset %q: bad %s %q: %s", ref, what, v, strings.Join(errs, "; "))
		}
	}
	return namespace, name, nil
}

// startOwnerWatch checks that the DaemonSet exists (a wrong name must not
// read as "deleted" at shutdown) and watches it until ctx is done.
func startOwnerWatch(ctx context.Context, client kubernetes.Interface, ref string) (*ownerWatch, error) {
	ns, name, err := parseDaemonSetRef(ref)
	if err != nil {
		return nil, err
	}
	w := &ownerWatch{client: client, namespace: ns, name: name}
	getCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := client.AppsV1().DaemonSets(ns).Get(getCtx, name, metav1.GetOptions{}); err != nil {
		return nil, fmt.Errorf("--daemonset %s: reading tessera-node's own DaemonSet: %w", ref, err)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + name }))
	inf := factory.Apps().V1().DaemonSets().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.see,
		UpdateFunc: func(_, obj any) { w.see(obj) },
		DeleteFunc: func(any) { w.deleted.Store(true) },
	}); err != nil {
		return nil, fmt.Errorf("watching DaemonSet %s: %w", ref, err)
	}
	factory.Start(ctx.Done())
	return w, nil
}

func (w *ownerWatch) see(obj any) {
	if ds, ok := obj.(*appsv1.DaemonSet); ok && ds.DeletionTimestamp != nil {
		w.deleted.Store(true)
	}
}

// uninstalling says whether the DaemonSet is deleted or being deleted: from
// the watch, or failing that from one last read (NotFound). Any other
// answer, an error included, means "keep the node's state".
func (w *ownerWatch) uninstalling(logger klog.Logger) bool {
	if w.deleted.Load() {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	ds, err := w.client.AppsV1().DaemonSets(w.namespace).Get(ctx, w.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true
	case err != nil:
		logger.Info("Cannot tell whether tessera-node is being uninstalled; keeping its state", "daemonSet", klog.KRef(w.namespace, w.name), "err", err)
		return false
	}
	return ds.DeletionTimestamp != nil
}
