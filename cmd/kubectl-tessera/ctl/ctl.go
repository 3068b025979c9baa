// Package ctl is kubectl-tessera, the kubectl plugin (`kubectl tessera ...`):
// what an operator asks of a cluster that Tessera schedules, read from the
// objects tessera-controller and tessera-node write.
//
//	queues      the queue tree: priority, GPU quota, limit and weight; the
//	            scheduler's fair share, what is allocated and pending; pods;
//	            recent usage (the usage history's decayed GPU-hours)
//	nodes       every Tessera GPU: model, memory, sharing mode, what is used
//	            and by which pods (from ResourceSlices and allocated claims)
//	why POD     why a pod waits: the scheduler's reason, its queue, its gang
//	            (PodGroup, who made it, its state) and the scheduler's recent
//	            events for it
//	shadow      shadow mode's report (tessera-controller --shadow): pods of
//	            other schedulers Tessera would place elsewhere or leave
//	            pending, fair share per queue, what a takeover would evict
package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	gpuconfig "github.com/tessera-gpu/tessera/api/config/v1alpha1"
	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/internal/draname"
)

// Clients are what the commands read with.
type Clients struct {
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// Namespace is the namespace of `why` (kubectl's -n, or the context's).
	Namespace string
	// RestConfig is the user's client configuration: snapshot and shadow
	// present its credentials to tessera-controller's debug server.
	RestConfig *rest.Config
}

// Usage is the plugin's help.
const Usage = `kubectl tessera: what Tessera is doing with the cluster's GPUs

  kubectl tessera queues        the queue tree: quota, fair share, allocated, pending
  kubectl tessera nodes         every GPU: model, memory, sharing, use, pods
  kubectl tessera why POD       why a pod is not running yet
  kubectl tessera shadow [-o json]
                                shadow mode's report: where Tessera would put the
                                pods of other schedulers, fair shares, a takeover
  kubectl tessera snapshot [-o FILE] [--anonymize [--anonymize-key KEYFILE]]
                                the next scheduling cycle's exact input and decisions
                                (tessera-sim replay); --anonymize renames every
                                user-chosen name (the replay decides the same);
                                --anonymize-key also writes the key

shadow and snapshot read tessera-controller's debug server through a
port-forward to the leader pod, with your own credentials; their flags follow
the command: --controller-namespace, --lease, --port, or --address HOST:PORT
with --certificate-authority FILE or --insecure-skip-tls-verify.

Flags: --kubeconfig, --context, -n/--namespace (as kubectl's)
`

// Run runs one command.
func Run(ctx context.Context, c Clients, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("no command (queues, nodes, why POD)")
	}
	switch args[0] {
	case "queues":
		return queues(ctx, c, out)
	case "nodes":
		return nodes(ctx, c, out)
	case "why":
		if len(args) != 2 {
			return errors.New("why takes one pod name")
		}
		return why(ctx, c, args[1], out)
	case "shadow":
		return shadow(ctx, c, args[1:], out)
	case "snapshot":
		return snapshot(ctx, c, args[1:], out)
	}
	return fmt.Errorf("unknown command %q (queues, nodes, why POD, shadow, snapshot)", args[0])
}

func queues(ctx context.Context, c Clients, out io.Writer) error {
	list, err := c.Dynamic.Resource(kube.QueueGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing queues: %w", err)
	}
	byName := map[string]*schedv1.Queue{}
	children := map[string][]string{}
	for i := range list.Items {
		q := &schedv1.Queue{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[i].Object, q); err != nil {
			return fmt.Errorf("queue %s: %w", list.Items[i].GetName(), err)
		}
		byName[q.Name] = q
	}
	var roots []string
	for name, q := range byName {
		if p := q.Spec.Parent; p != "" && byName[p] != nil {
			children[p] = append(children[p], name)
		} else {
			roots = append(roots, name) // a top-level queue, or one whose parent is missing
		}
	}
	sort.Strings(roots)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tPRIORITY\tGPU QUOTA\tLIMIT\tWEIGHT\tFAIR SHARE\tALLOCATED\tPENDING\tPODS RUNNING/PENDING\tRECENT GPU-HOURS")
	var walk func(name, prefix string, last bool, depth int)
	walk = func(name, prefix string, last bool, depth int) {
		q := byName[name]
		label := name
		if depth > 0 {
			branch := "├─ "
			if last {
				branch = "└─ "
			}
			label = prefix + branch + name
		}
		if p := q.Spec.Parent; p != "" && byName[p] == nil {
			label += " (parent " + p + " missing)"
		}
		prio := int32(100)
		if q.Spec.Priority != nil {
			prio = *q.Spec.Priority
		}
		quota, limit, weight := "0", "none", "1"
		if g := q.Spec.Resources.GPU; g != nil {
			if g.Quota != nil {
				quota = orUnlimited(g.Quota, "unlimited")
			}
			if g.Limit != nil {
				limit = orUnlimited(g.Limit, "none")
			}
			if g.OverQuotaWeight != nil {
				weight = fmt.Sprint(*g.OverQuotaWeight)
			}
		}
		share, alloc, pend, recent := "-", "-", "-", "-"
		if st, ok := q.Status.Resources["gpu"]; ok {
			share, alloc, pend = gpus(st.FairShare), gpus(st.Allocated), gpus(st.Pending)
			if st.Usage != nil {
				recent = gpuHours(*st.Usage)
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\n", label, prio, quota, limit, weight, share, alloc, pend, q.Status.RunningPods, q.Status.PendingPods, recent)
		kids := children[name]
		sort.Strings(kids)
		next := prefix
		if depth > 0 {
			next += map[bool]string{true: "   ", false: "│  "}[last]
		}
		for i, k := range kids {
			walk(k, next, i == len(kids)-1, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, "", true, 0)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if byName[kube.DefaultQueue] == nil {
		fmt.Fprintf(out, "\nPods without a %s label run in queue %q, which has no Queue object (no quota, no status).\n", kube.LabelQueue, kube.DefaultQueue)
	}
	return nil
}

// orUnlimited writes a quota or limit, or word for -1.
func orUnlimited(q *resource.Quantity, word string) string {
	if q.String() == schedv1.Unlimited {
		return word
	}
	return gpus(*q)
}

// gpus writes a GPU amount as a decimal (1.5, not 1500m).
func gpus(q resource.Quantity) string {
	return strconv.FormatFloat(float64(q.MilliValue())/1000, 'f', -1, 64)
}

// gpuHours writes a decayed usage in GPU-seconds as GPU-hours: three
// decimals below 10 (a few minutes of one GPU still shows), one above.
func gpuHours(q resource.Quantity) string {
	h := float64(q.MilliValue()) / 1000 / 3600
	if h < 10 {
		return strconv.FormatFloat(h, 'f', 3, 64)
	}
	return strconv.FormatFloat(h, 'f', 1, 64)
}

// gpuUse is what the allocated claims hold of one GPU.
type gpuUse struct {
	memory  int64 // bytes; whole when a claim consumed no capacity
	whole   bool
	sharing string
	pods    []string
}

func nodes(ctx context.Context, c Clients, out io.Writer) error {
	sliceList, err := c.Kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + draname.Driver})
	if err != nil {
		return fmt.Errorf("listing ResourceSlices: %w", err)
	}
	claims, err := c.Kube.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing ResourceClaims: %w", err)
	}
	pods, err := c.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	use := map[string]*gpuUse{} // pool/device
	claimUse(use, claims.Items, pods.Items)
	devicePluginUse(use, sliceList.Items, pods.Items)
	rows := gpuRows(sliceList.Items, use)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tGPU\tMODEL\tMEMORY\tSHARING\tUSED\tPODS")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.node, r.device, dash(r.model), resource.NewQuantity(r.memory, resource.BinarySI), dash(r.sharing), r.used, dash(r.pods))
	}
	return tw.Flush()
}

// useOf is the record of one GPU (pool/device), made on first use.
func useOf(use map[string]*gpuUse, key string) *gpuUse {
	u := use[key]
	if u == nil {
		u = &gpuUse{}
		use[key] = u
	}
	return u
}

// claimUse records what allocated claims of Tessera's driver hold, and
// by which pods.
func claimUse(use map[string]*gpuUse, claims []resourceapi.ResourceClaim, pods []v1.Pod) {
	podName := map[string]string{}
	for _, p := range pods {
		podName[string(p.UID)] = p.Namespace + "/" + p.Name
	}
	for i := range claims {
		cl := &claims[i]
		if cl.Status.Allocation == nil {
			continue
		}
		var holders []string
		for _, r := range cl.Status.ReservedFor {
			if n, ok := podName[string(r.UID)]; ok {
				holders = append(holders, n)
			} else {
				holders = append(holders, cl.Namespace+"/"+r.Name)
			}
		}
		if len(holders) == 0 {
			holders = []string{"claim " + cl.Namespace + "/" + cl.Name + " (no pod)"}
		}
		for _, r := range cl.Status.Allocation.Devices.Results {
			if r.Driver != draname.Driver {
				continue
			}
			u := useOf(use, r.Pool+"/"+r.Device)
			if q, ok := r.ConsumedCapacity[draname.CapacityMemory]; ok {
				u.memory += q.Value()
				if cfg, err := gpuconfig.ConfigForRequest(draname.Driver, cl.Status.Allocation.Devices.Config, r.Request); err == nil {
					u.sharing = string(cfg.Strategy())
				}
			} else {
				u.whole = true
			}
			u.pods = append(u.pods, holders...)
		}
	}
}

// devicePluginUse records what device-plugin pods hold: what their
// assignment says, on the pool of their node (a bound pod that has not
// finished).
func devicePluginUse(use map[string]*gpuUse, resSlices []resourceapi.ResourceSlice, pods []v1.Pod) {
	poolOf := map[string]string{}
	for _, s := range resSlices {
		if s.Spec.NodeName != nil {
			poolOf[*s.Spec.NodeName] = s.Spec.Pool.Name
		}
	}
	for i := range pods {
		p := &pods[i]
		a, ok, err := assignment.Of(p.Annotations)
		if !ok || err != nil || p.Spec.NodeName == "" || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue
		}
		for _, idx := range a.GPUs {
			u := useOf(use, poolOf[p.Spec.NodeName]+"/gpu-"+strconv.Itoa(idx))
			if a.IsShare() {
				u.memory += a.MemoryBytes
				u.sharing = a.Sharing
			} else {
				u.whole = true
			}
			u.pods = append(u.pods, p.Namespace+"/"+p.Name)
		}
	}
}

// gpuRow is one line of `kubectl tessera nodes`.
type gpuRow struct {
	node, device, model, sharing, used, pods string
	memory                                   int64
	index                                    int64
}

// gpuRows is a row per device of each pool's newest generation, by node
// and GPU index.
func gpuRows(resSlices []resourceapi.ResourceSlice, use map[string]*gpuUse) []gpuRow {
	var rows []gpuRow
	newest := map[string]int64{}
	for _, s := range resSlices {
		newest[s.Spec.Pool.Name] = max(newest[s.Spec.Pool.Name], s.Spec.Pool.Generation)
	}
	for _, s := range resSlices {
		if s.Spec.Pool.Generation != newest[s.Spec.Pool.Name] {
			continue
		}
		node := s.Spec.Pool.Name
		if s.Spec.NodeName != nil {
			node = *s.Spec.NodeName
		}
		for _, d := range s.Spec.Devices {
			rows = append(rows, gpuRowOf(node, d, use[s.Spec.Pool.Name+"/"+d.Name]))
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].node != rows[j].node {
			return rows[i].node < rows[j].node
		}
		if rows[i].index != rows[j].index {
			return rows[i].index < rows[j].index
		}
		return rows[i].device < rows[j].device
	})
	return rows
}

// gpuRowOf says what one device is and who uses it how much (u nil: no
// claim or assignment names it).
func gpuRowOf(node string, d resourceapi.Device, u *gpuUse) gpuRow {
	r := gpuRow{node: node, device: d.Name, index: -1}
	if a, ok := d.Attributes[draname.AttrProductName]; ok && a.StringValue != nil {
		r.model = *a.StringValue
	}
	if a, ok := d.Attributes[draname.AttrIndex]; ok && a.IntValue != nil {
		r.index = *a.IntValue
	}
	if cp, ok := d.Capacity[draname.CapacityMemory]; ok {
		r.memory = cp.Value.Value()
	}
	switch {
	case u == nil:
		r.used = "free"
	case u.whole || u.sharing == string(gpuconfig.Exclusive) || r.memory > 0 && u.memory >= r.memory && u.sharing == "":
		// An exclusive claim consumes the whole memory capacity.
		r.used, r.sharing = "whole", string(gpuconfig.Exclusive)
	default:
		r.used = resource.NewQuantity(u.memory, resource.BinarySI).String()
		if r.memory > 0 {
			r.used += fmt.Sprintf(" (%d%%)", u.memory*100/r.memory)
		}
		r.sharing = u.sharing
	}
	if u != nil {
		ps := slices.Clone(u.pods)
		sort.Strings(ps)
		r.pods = strings.Join(slices.Compact(ps), ", ")
	}
	for _, taint := range d.Taints {
		if taint.Key != draname.TaintDevicePlugin {
			r.used += " (tainted: " + string(taint.Effect) + ")"
			break
		}
		if u == nil {
			// Held through the device plugin by a pod that no
			// assignment names (bound by another scheduler).
			r.used, r.pods = taint.Value, "(a device-plugin pod)"
			if taint.Value == draname.TaintWhole {
				r.sharing = string(gpuconfig.Exclusive)
			}
		}
	}
	return r
}

// describeAssignment says in words what a device-plugin pod was given.
func describeAssignment(a assignment.Assignment) string {
	gpus := make([]string, len(a.GPUs))
	for i, g := range a.GPUs {
		gpus[i] = draname.DeviceName(g)
	}
	if !a.IsShare() {
		return "whole " + strings.Join(gpus, ", ")
	}
	return fmt.Sprintf("%s of %s (%.1f%% compute), %s", resource.NewQuantity(a.MemoryBytes, resource.BinarySI), gpus[0], float64(a.ComputeMilli)/10, a.Sharing)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func why(ctx context.Context, c Clients, name string, out io.Writer) error {
	pod, err := c.Kube.CoreV1().Pods(c.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	queue := pod.Labels[kube.LabelQueue]
	if queue == "" {
		queue = kube.DefaultQueue + " (no " + kube.LabelQueue + " label)"
	}
	fmt.Fprintf(out, "Pod %s/%s, queue %s", pod.Namespace, pod.Name, queue)
	fmt.Fprintln(out)
	if err := describeGroup(ctx, c, pod, out); err != nil {
		return err
	}
	switch {
	case pod.Spec.SchedulerName != kube.SchedulerName:
		fmt.Fprintf(out, "Not scheduled by Tessera: schedulerName is %q, not %q.\n", pod.Spec.SchedulerName, kube.SchedulerName)
	case pod.Spec.NodeName != "":
		fmt.Fprintf(out, "Scheduled to node %s; phase %s.\n", pod.Spec.NodeName, pod.Status.Phase)
		if a, ok, err := assignment.Of(pod.Annotations); err != nil {
			fmt.Fprintf(out, "Device plugin: %v\n", err)
		} else if ok {
			fmt.Fprintf(out, "Device plugin: %s\n", describeAssignment(a))
		}
	default:
		reason := "no decision yet (is tessera-controller running and leading?)"
		for _, cond := range pod.Status.Conditions {
			if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse {
				reason = cond.Message
			}
		}
		fmt.Fprintf(out, "Pending: %s\n", reason)
	}
	events, err := c.Kube.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Pod,involvedObject.name=" + pod.Name})
	if err != nil {
		return fmt.Errorf("listing events: %w", err)
	}
	var mine []v1.Event
	for _, e := range events.Items {
		if e.InvolvedObject.UID == pod.UID && (e.Source.Component == kube.SchedulerName || e.ReportingController == kube.SchedulerName) {
			mine = append(mine, e)
		}
	}
	sort.Slice(mine, func(i, j int) bool { return eventTime(mine[i]).Time.Before(eventTime(mine[j]).Time) })
	if len(mine) > 5 {
		mine = mine[len(mine)-5:]
	}
	if len(mine) > 0 {
		fmt.Fprintln(out, "Scheduler events (newest last):")
		for _, e := range mine {
			fmt.Fprintf(out, "  %s  %s: %s\n", eventTime(e).Format("15:04:05"), e.Reason, e.Message)
		}
	}
	return nil
}

func eventTime(e v1.Event) metav1.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp
	case !e.EventTime.IsZero():
		return metav1.Time{Time: e.EventTime.Time}
	}
	return e.FirstTimestamp
}
