package scheduler_test

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/test/controlplane"
	"github.com/tessera-gpu/tessera/test/framework"
)

// upstreamGroup creates a scheduling.k8s.io/v1beta1 PodGroup: a gang of
// minCount (0: the basic policy), disruption "single", "all" or "" (the
// API's default, single).
func (e *env) upstreamGroup(name string, minCount int32, disruption string) {
	e.T.Helper()
	pg := &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.NS},
		Spec:       schedulingv1beta1.PodGroupSpec{PriorityClassName: "tessera-train"},
	}
	if minCount > 0 {
		pg.Spec.SchedulingPolicy.Gang = &schedulingv1beta1.GangSchedulingPolicy{MinCount: minCount}
	} else {
		pg.Spec.SchedulingPolicy.Basic = &schedulingv1beta1.BasicSchedulingPolicy{}
	}
	switch disruption {
	case "single":
		pg.Spec.DisruptionMode = &schedulingv1beta1.DisruptionMode{Single: &schedulingv1beta1.SingleDisruptionMode{}}
	case "all":
		pg.Spec.DisruptionMode = &schedulingv1beta1.DisruptionMode{All: &schedulingv1beta1.AllDisruptionMode{}}
	}
	if _, err := e.Client.SchedulingV1beta1().PodGroups(e.NS).Create(e.Ctx, pg, metav1.CreateOptions{}); err != nil {
		e.T.Fatalf("creating PodGroup %s: %v", name, err)
	}
}

// upstreamCondition returns the status of a condition of an upstream
// PodGroup, "" when it has none.
func (e *env) upstreamCondition(name, condition string) (metav1.ConditionStatus, string) {
	pg, err := e.Client.SchedulingV1beta1().PodGroups(e.NS).Get(e.Ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err.Error()
	}
	c := meta.FindStatusCondition(pg.Status.Conditions, condition)
	if c == nil {
		return "", fmt.Sprintf("no %s condition in %+v", condition, pg.Status.Conditions)
	}
	return c.Status, c.Reason + ": " + c.Message
}

func (e *env) waitUpstreamCondition(name, condition string, want metav1.ConditionStatus) {
	e.T.Helper()
	e.eventually(fmt.Sprintf("PodGroup %s %s=%s", name, condition, want), 30*time.Second, func() (bool, string) {
		got, msg := e.upstreamCondition(name, condition)
		return got == want, string(got) + " " + msg
	})
}

func (e *env) live(names ...string) int {
	n := 0
	for _, name := range names {
		if p := e.pod(name); p != nil && p.DeletionTimestamp == nil && p.Spec.NodeName != "" {
			n++
		}
	}
	return n
}

func (e *env) deletePods(names ...string) {
	e.T.Helper()
	for _, n := range names {
		if err := e.Client.CoreV1().Pods(e.NS).Delete(e.Ctx, n, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			e.T.Fatal(err)
		}
	}
	e.eventually("pods gone", 30*time.Second, func() (bool, string) {
		for _, n := range names {
			if e.pod(n) != nil {
				return false, n + " still there"
			}
		}
		return true, ""
	})
}

// TestUpstreamGangs: Kubernetes 1.37's own PodGroups (scheduling.k8s.io/
// v1beta1, GenericWorkload) schedule as Tessera gangs, on a control plane
// that serves them.
func TestUpstreamGangs(t *testing.T) {
	e := newEnvWith(t, controlplane.Options{Workloads: controlplane.WorkloadAPI{Jobs: true}})
	e.addGPUNode("dgx-0", "h100-sxm-8")
	e.createQueue("team-a", "", "4", "", 100)
	e.createQueue("team-b", "", "4", "", 100)
	// A short stale-gang timeout, so a Single gang left below its minimum
	// would be stale-evicted within the test if the rule applied to it.
	e.startScheduler(core.Config{DisableConsolidation: true, StaleGangTimeout: 2 * time.Second})
	e.eventually("upstream PodGroups watched", 30*time.Second, func() (bool, string) {
		return e.sched.UpstreamGroupsServed(), "not served"
	})

	t.Run("partial fit binds none, then all", func(t *testing.T) {
		e.createPod(podSpec{name: "filler", queue: "team-b", priority: "tessera-build", claim: &gpuClaim{count: 4}})
		e.waitBound("filler")
		e.upstreamGroup("train", 4, "")
		var names []string
		for i := range 4 {
			n := fmt.Sprintf("train-%d", i)
			names = append(names, n)
			e.createPod(podSpec{name: n, queue: "team-a", priority: "tessera-train", upstreamGroup: "train", claim: &gpuClaim{count: 2}})
		}
		e.eventually("gang pending with its reason", 30*time.Second, func() (bool, string) {
			why := pendingReason(e.pod("train-0"))
			return contains(why, "gang scheduling.k8s.io/"+e.NS+"/train"), why
		})
		e.waitUpstreamCondition("train", schedulingv1beta1.PodGroupInitiallyScheduled, metav1.ConditionFalse)
		time.Sleep(time.Second) // more cycles
		if n := e.live(names...); n != 0 {
			t.Fatalf("%d pods of a gang that does not fit were bound", n)
		}
		e.deletePods("filler")
		e.waitBound(names...)
		e.waitUpstreamCondition("train", schedulingv1beta1.PodGroupInitiallyScheduled, metav1.ConditionTrue)
		e.deletePods(names...)
	})

	t.Run("PodGroup created after its pods", func(t *testing.T) {
		names := []string{"late-0", "late-1"}
		for _, n := range names {
			e.createPod(podSpec{name: n, queue: "team-a", priority: "tessera-train", upstreamGroup: "late", claim: &gpuClaim{count: 1}})
		}
		e.eventually("pods wait for their PodGroup", 30*time.Second, func() (bool, string) {
			why := pendingReason(e.pod("late-0"))
			return contains(why, "waiting for PodGroup "+e.NS+"/late (scheduling.k8s.io)"), why
		})
		e.upstreamGroup("late", 2, "all")
		e.waitBound(names...)
		e.deletePods(names...)
	})

	// Reclaim takes capacity back for team b (or d), for one pod of two
	// GPUs (one pod: evictions are decided in one cycle). Single: team a's
	// gang of eight fills the node; team b's pod takes two of its members,
	// and the other six keep running past the stale-gang timeout. All:
	// team c (quota 1) runs four plain pods and a gang of four (minCount
	// 2); team d's pod takes the whole gang, not two members of it as
	// Tessera's own rule would (the gang stays above its minimum), and its
	// PodGroup says so.
	e.createQueue("team-c", "", "1", "", 100)
	e.createQueue("team-d", "", "4", "", 100)
	for _, c := range []struct {
		mode, victims, claimant string
		min, size, plain        int
		wantLive                int
	}{{"single", "team-a", "team-b", 8, 8, 0, 6}, {"all", "team-c", "team-d", 2, 4, 4, 0}} {
		t.Run("reclaim with disruption "+c.mode, func(t *testing.T) {
			group := "gang-" + c.mode
			var plain, names []string
			b := "b-" + c.mode
			defer func() { // the next subtests need the node empty
				for _, n := range append(append(names, plain...), b) {
					if e.pod(n) != nil {
						e.deletePods(n)
					}
				}
			}()
			for i := range c.plain {
				n := fmt.Sprintf("plain-%s-%d", c.mode, i)
				plain = append(plain, n)
				e.createPod(podSpec{name: n, queue: c.victims, priority: "tessera-train", claim: &gpuClaim{count: 1}})
			}
			e.waitBound(plain...)
			time.Sleep(1100 * time.Millisecond) // the gang is the newer job: victims come from it first
			e.upstreamGroup(group, int32(c.min), c.mode)
			for i := range c.size {
				n := fmt.Sprintf("%s-%d", group, i)
				names = append(names, n)
				e.createPod(podSpec{name: n, queue: c.victims, priority: "tessera-train", upstreamGroup: group, claim: &gpuClaim{count: 1}})
			}
			e.waitBound(names...)
			e.createPod(podSpec{name: b, queue: c.claimant, priority: "tessera-train", claim: &gpuClaim{count: 2}})
			e.waitBound(b)
			time.Sleep(4 * time.Second) // past the stale-gang timeout
			if n := e.live(names...); n != c.wantLive {
				t.Fatalf("%d pods of the %s gang left running; want %d", n, c.mode, c.wantLive)
			}
			if n := e.live(plain...); n != c.plain {
				t.Fatalf("%d of %d plain pods left running", n, c.plain)
			}
			got, msg := e.upstreamCondition(group, schedulingv1beta1.DisruptionTarget)
			if want := map[string]metav1.ConditionStatus{"single": "", "all": metav1.ConditionTrue}[c.mode]; got != want {
				t.Fatalf("DisruptionTarget %q (%s); want %q", got, msg, want)
			}
		})
	}

	// A batch Job with the upstream gang policy: kube-controller-manager's
	// Job controller (WorkloadWithJob) creates the Workload and PodGroup and
	// sets spec.schedulingGroup; nothing on it is Tessera's but the
	// scheduler name and the queue label.
	t.Run("Job with a gang policy", func(t *testing.T) {
		e.createPod(podSpec{name: "job-filler", queue: "team-b", priority: "tessera-build", claim: &gpuClaim{count: 4}})
		e.waitBound("job-filler")
		tmpl := e.claimTemplate("job-worker", gpuClaim{count: 2})
		// The manifest TestGangJobWithoutTheAPI (test/e2e/grouper) creates
		// where the API is not served.
		job := framework.GangJob(e.NS, "llama", 3, "team-a", tmpl, "tessera-train")
		if _, err := e.Client.BatchV1().Jobs(e.NS).Create(e.Ctx, job, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var pods []v1.Pod
		e.eventually("the Job's 3 pods in its PodGroup, none bound", 60*time.Second, func() (bool, string) {
			list, err := e.Client.CoreV1().Pods(e.NS).List(e.Ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=llama"})
			if err != nil {
				return false, err.Error()
			}
			pods = list.Items
			if len(pods) != 3 {
				return false, fmt.Sprintf("%d pods", len(pods))
			}
			for _, p := range pods {
				if p.Spec.NodeName != "" {
					t.Fatalf("pod %s bound while its gang of 3 × 2 GPUs does not fit 4 free GPUs", p.Name)
				}
				if p.Spec.SchedulingGroup == nil || p.Spec.SchedulingGroup.PodGroupName == nil {
					return false, p.Name + " has no spec.schedulingGroup"
				}
				if why := pendingReason(&p); !contains(why, "gang scheduling.k8s.io/"+e.NS+"/") {
					return false, p.Name + ": " + why
				}
			}
			return true, ""
		})
		group := *pods[0].Spec.SchedulingGroup.PodGroupName
		e.deletePods("job-filler")
		var names []string
		for _, p := range pods {
			names = append(names, p.Name)
		}
		e.waitBound(names...)
		e.waitUpstreamCondition(group, schedulingv1beta1.PodGroupInitiallyScheduled, metav1.ConditionTrue)
	})
	e.checkNoDoubleAllocation()
}

// TestUpstreamNotServed: where scheduling.k8s.io/v1beta1 is not served
// (Kubernetes' default), discovery says so, nothing watches it and Tessera's
// own gangs schedule as before.
func TestUpstreamNotServed(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("dgx-0", "h100-sxm-8")
	e.startScheduler(core.Config{})
	e.createPodGroup("pair", "", 2)
	e.createPod(podSpec{name: "pair-0", group: "pair", claim: &gpuClaim{count: 1}})
	e.createPod(podSpec{name: "pair-1", group: "pair", claim: &gpuClaim{count: 1}})
	e.waitBound("pair-0", "pair-1")
	if e.sched.UpstreamGroupsServed() {
		t.Fatal("scheduling.k8s.io/v1beta1 PodGroups watched on a control plane that does not serve them")
	}
}
