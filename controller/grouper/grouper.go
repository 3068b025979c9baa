// Package grouper is tessera-controller's pod grouper: it gives the pods of
// tessera-scheduler that belong to no group (no spec.schedulingGroup, no
// tessera.dev/pod-group) the gang their workload needs. It walks a pod's
// controller owner references up to the top owner it knows, reads that
// owner's spec as unstructured (no operator's Go types), derives the group
// (derive.go), creates a Tessera PodGroup owned by the workload, and
// annotates the pod with tessera.dev/pod-group. The scheduler keeps such a
// pod waiting until then (kube.AwaitsGrouper), so no member of a gang binds
// before its minimum is known. README.md says what each kind becomes.
package grouper

import (
	"context"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controller/kube"
)

// Options configures a Grouper.
type Options struct {
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// Workers is how many pods are grouped in parallel (default 2).
	Workers int
}

// Grouper is the pod grouper. Run it only where the scheduler runs (the
// leader): the scheduler waits for it (Waiting).
type Grouper struct {
	opts     Options
	factory  informers.SharedInformerFactory
	nsFact   informers.SharedInformerFactory
	dfactory dynamicinformer.DynamicSharedInformerFactory
	pods     corelisters.PodLister
	nsLister corelisters.NamespaceLister
	groups   cache.GenericLister
	queue    workqueue.TypedRateLimitingInterface[string]

	mu sync.Mutex
	// runCtx is Run's context, for the owner informers started later.
	runCtx context.Context
	// owners are the informers of the owner kinds met so far, started the
	// first time a pod's walk needs one (a CRD installed after the start
	// is found then).
	owners map[schema.GroupVersionResource]cache.SharedIndexInformer
	// followers are, per owner UID, the pods whose group it decides: a
	// change of the owner (scaled, annotated) groups them again.
	followers map[types.UID]map[string]bool
	// why is, per pod key, what keeps it from being grouped (an owner spec
	// that cannot be read, an override that is not a number).
	why map[string]string
}

// New builds a Grouper; Run starts it.
func New(opts Options) (*Grouper, error) {
	if opts.Client == nil || opts.Dynamic == nil {
		return nil, fmt.Errorf("grouper: Client and Dynamic are required")
	}
	if opts.Workers <= 0 {
		opts.Workers = 2
	}
	g := &Grouper{
		opts: opts,
		// Only our pods: the grouper groups nothing else.
		factory: informers.NewSharedInformerFactoryWithOptions(opts.Client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.schedulerName", kube.SchedulerName).String()
		})),
		nsFact: informers.NewSharedInformerFactory(opts.Client, 0),
		dfactory: dynamicinformer.NewFilteredDynamicSharedInformerFactory(opts.Dynamic, 0, "", func(o *metav1.ListOptions) {
			o.LabelSelector = labels.SelectorFromSet(labels.Set{kube.LabelGroupedBy: kube.GroupedByPodGrouper}).String()
		}),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "pod-grouper"}),
		owners:    map[schema.GroupVersionResource]cache.SharedIndexInformer{},
		followers: map[types.UID]map[string]bool{},
		why:       map[string]string{},
	}
	podInf := g.factory.Core().V1().Pods()
	g.pods = podInf.Lister()
	g.nsLister = g.nsFact.Core().V1().Namespaces().Lister()
	groupInf := g.dfactory.ForResource(kube.PodGroupGVR)
	g.groups = groupInf.Lister()
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    g.podChanged,
		UpdateFunc: func(_, obj any) { g.podChanged(obj) },
		DeleteFunc: g.podDeleted,
	}); err != nil {
		return nil, fmt.Errorf("grouper: %w", err)
	}
	// A PodGroup of ours deleted under its pods is made again.
	if _, err := groupInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: g.groupDeleted}); err != nil {
		return nil, fmt.Errorf("grouper: %w", err)
	}
	return g, nil
}

// Run groups pods until ctx ends.
func (g *Grouper) Run(ctx context.Context) error {
	defer utilruntime.HandleCrash()
	defer g.queue.ShutDown()
	logger := klog.FromContext(ctx).WithName("pod-grouper")
	ctx = klog.NewContext(ctx, logger)
	g.mu.Lock()
	g.runCtx = ctx
	g.mu.Unlock()
	g.factory.Start(ctx.Done())
	g.nsFact.Start(ctx.Done())
	g.dfactory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), g.factory.Core().V1().Pods().Informer().HasSynced,
		g.nsFact.Core().V1().Namespaces().Informer().HasSynced, g.dfactory.ForResource(kube.PodGroupGVR).Informer().HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("grouper: informer caches did not sync")
	}
	logger.Info("Pod grouper started", "workers", g.opts.Workers)
	var wg sync.WaitGroup
	for range g.opts.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wait.UntilWithContext(ctx, g.work, time.Second)
		}()
	}
	<-ctx.Done()
	g.queue.ShutDown()
	wg.Wait()
	g.factory.Shutdown()
	g.nsFact.Shutdown()
	g.dfactory.Shutdown()
	return nil
}

func (g *Grouper) work(ctx context.Context) {
	for {
		key, quit := g.queue.Get()
		if quit {
			return
		}
		err := g.sync(ctx, key)
		g.mu.Lock()
		if err != nil {
			g.why[key] = err.Error()
		} else {
			delete(g.why, key)
		}
		g.mu.Unlock()
		if err != nil {
			klog.FromContext(ctx).Info("Cannot group pod yet", "pod", key, "err", err)
			g.queue.AddRateLimited(key)
		} else {
			g.queue.Forget(key)
		}
		g.queue.Done(key)
	}
}

// Waiting is the reason a pending pod of ours waits for the grouper, ""
// when it does not (kube.Options.AwaitGrouper).
func (g *Grouper) Waiting(pod *v1.Pod) string {
	if !kube.AwaitsGrouper(pod) {
		return ""
	}
	ref := metav1.GetControllerOf(pod)
	why := fmt.Sprintf("waiting for the pod grouper to work out the gang of its %s %s", ref.Kind, ref.Name)
	g.mu.Lock()
	defer g.mu.Unlock()
	if e := g.why[pod.Namespace+"/"+pod.Name]; e != "" {
		why += ": " + e
	}
	return why
}

// wanted says whether the grouper looks at a pod at all: one the scheduler
// holds for it (kube.AwaitsGrouper), or one it grouped already (its group
// follows the owner). Pods of other controllers (a Deployment's) cost no
// walk and no write.
func wanted(pod *v1.Pod) bool {
	if pod.DeletionTimestamp != nil {
		return false
	}
	if kube.AwaitsGrouper(pod) {
		return true
	}
	return pod.Spec.SchedulerName == kube.SchedulerName && pod.Spec.SchedulingGroup == nil &&
		pod.Annotations[kube.AnnotationPodGroup] != "" && metav1.GetControllerOf(pod) != nil
}

func (g *Grouper) podChanged(obj any) {
	pod, ok := obj.(*v1.Pod)
	if !ok || !wanted(pod) {
		return
	}
	// A pod grouped already is looked at again only when its owner
	// changes (followers), or at a restart (to learn its owners).
	g.queue.Add(pod.Namespace + "/" + pod.Name)
}

func (g *Grouper) podDeleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	key := pod.Namespace + "/" + pod.Name
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.why, key)
	for uid, pods := range g.followers {
		delete(pods, key)
		if len(pods) == 0 {
			delete(g.followers, uid)
		}
	}
}

func (g *Grouper) groupDeleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	pods, err := g.pods.Pods(u.GetNamespace()).List(labels.Everything())
	if err != nil {
		return
	}
	for _, p := range pods {
		if p.Annotations[kube.AnnotationPodGroup] == u.GetName() && wanted(p) {
			g.queue.Add(p.Namespace + "/" + p.Name)
		}
	}
}

// ownerChanged groups again the pods an owner decides.
func (g *Grouper) ownerChanged(obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for key := range g.followers[u.GetUID()] {
		g.queue.Add(key)
	}
}

// follow records that key's group depends on these owners.
func (g *Grouper) follow(key string, chain []link) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, l := range chain {
		uid := l.obj.GetUID()
		if g.followers[uid] == nil {
			g.followers[uid] = map[string]bool{}
		}
		g.followers[uid][key] = true
	}
}

// sync groups one pod.
func (g *Grouper) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := g.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil || !wanted(pod) {
		return err
	}
	if pg := pod.Annotations[kube.AnnotationPodGroup]; pg != "" {
		if _, err := g.groups.ByNamespace(ns).Get(pg); err != nil {
			// The user's PodGroup (or one being made): not ours to manage.
			return nil
		}
	}
	chain, err := g.walk(ctx, pod)
	g.follow(key, chain)
	if err != nil {
		return err
	}
	if len(chain) == 0 {
		// Its controller is a kind the grouper does not know: alone.
		return nil
	}
	p, err := g.plan(pod, chain)
	if err != nil {
		return err
	}
	return g.apply(ctx, pod, p)
}
