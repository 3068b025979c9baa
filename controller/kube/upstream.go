package kube

// Kubernetes 1.37's own gangs: scheduling.k8s.io/v1beta1 PodGroups, which a
// pod names in spec.schedulingGroup.podGroupName (the Job controller with
// WorkloadWithJob creates them for a Job's spec.scheduling). Tessera reads
// them where the API server serves them (found by discovery at start) and
// writes their status as kube-scheduler does (upstream_status.go).

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/cache"

	"github.com/tessera-gpu/tessera/controller/core"
)

// upstreamGroupVersion serves the PodGroups Tessera reads.
var upstreamGroupVersion = schedulingv1beta1.SchemeGroupVersion.String()

// upstreamJobPrefix starts the core job name of an upstream PodGroup, so it
// never merges with a Tessera PodGroup (scheduling.tessera.dev) of the same
// name, whose job is "namespace/name".
const upstreamJobPrefix = "scheduling.k8s.io/"

// upstreamServed says whether the API server serves PodGroups of
// scheduling.k8s.io/v1beta1 (GenericWorkload on, the version enabled).
func upstreamServed(d discovery.DiscoveryInterface) (bool, error) {
	list, err := d.ServerResourcesForGroupVersion(upstreamGroupVersion)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discovering %s: %w", upstreamGroupVersion, err)
	}
	for _, r := range list.APIResources {
		if r.Name == "podgroups" {
			return true, nil
		}
	}
	return false, nil
}

// watchUpstreamGroups starts watching upstream PodGroups when the API server
// serves them; otherwise pods naming one wait (upstreamJob). Called by Start
// before the informer factory starts.
func (s *Scheduler) watchUpstreamGroups() error {
	served, err := upstreamServed(s.client.Discovery())
	if err != nil || !served {
		return err
	}
	inf := s.factory.Scheduling().V1beta1().PodGroups()
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.Kick() },
		UpdateFunc: func(any, any) { s.Kick() },
		DeleteFunc: func(any) { s.Kick() },
	}); err != nil {
		return err
	}
	s.upstreamLister = inf.Lister()
	return nil
}

// UpstreamGroupsServed says whether Start found scheduling.k8s.io/v1beta1
// PodGroups served and watches them.
func (s *Scheduler) UpstreamGroupsServed() bool { return s.upstreamLister != nil }

// upstreamGroup is what Tessera takes from an upstream PodGroup.
type upstreamGroup struct {
	// minMember is gang.minCount; 1 for the basic policy (pods one by one).
	minMember  int
	disruption core.Disruption
	// priority is spec.priority (admission resolves priorityClassName into
	// it); nil when unset, then priorityClass, else the pod's.
	priority      *int32
	priorityClass string
	// neverEvicts is spec.preemptionPolicy (PodGroupPreemptionPolicy);
	// nil when unset: the pod's.
	neverEvicts *bool
	// topologyKey is schedulingConstraints.topology's one key, "" for
	// none: the group's pods must share its node label's value
	// (snapshotBuild.upstreamTopology).
	topologyKey string
}

// readUpstreamGroup reads pg's spec. What Tessera cannot honour is refused
// with an error naming the field, so the group's pods wait saying why
// rather than being scheduled as if it were not there.
func readUpstreamGroup(pg *schedulingv1beta1.PodGroup) (upstreamGroup, error) {
	name := fmt.Sprintf("PodGroup %s/%s (scheduling.k8s.io)", pg.Namespace, pg.Name)
	var g upstreamGroup
	pol := pg.Spec.SchedulingPolicy
	switch {
	case pol.Gang != nil && pol.Basic != nil:
		return g, fmt.Errorf("%s: spec.schedulingPolicy sets both basic and gang; exactly one is allowed", name)
	case pol.Gang != nil:
		if pol.Gang.MinCount < 1 {
			return g, fmt.Errorf("%s: spec.schedulingPolicy.gang.minCount %d must be at least 1", name, pol.Gang.MinCount)
		}
		g.minMember = int(pol.Gang.MinCount)
	case pol.Basic != nil:
		g.minMember = 1
	default:
		return g, fmt.Errorf("%s: spec.schedulingPolicy sets neither basic nor gang", name)
	}
	if len(pg.Spec.ResourceClaims) > 0 {
		return g, fmt.Errorf("%s: spec.resourceClaims (claims shared by the group's pods, %q first) are not supported by tessera-scheduler; give each pod its own claim", name, pg.Spec.ResourceClaims[0].Name)
	}
	if p := pg.Spec.ParentCompositePodGroupName; p != nil {
		return g, fmt.Errorf("%s: spec.parentCompositePodGroupName %q: CompositePodGroups are not supported by tessera-scheduler", name, *p)
	}
	if c := pg.Spec.SchedulingConstraints; c != nil && len(c.Topology) > 0 {
		key := c.Topology[0].Key
		switch {
		case len(c.Topology) > 1:
			return g, fmt.Errorf("%s: spec.schedulingConstraints.topology has %d constraints; one is supported", name, len(c.Topology))
		case len(validation.IsQualifiedName(key)) > 0:
			return g, fmt.Errorf("%s: spec.schedulingConstraints.topology key %q is not a node label key: %s", name, key, strings.Join(validation.IsQualifiedName(key), "; "))
		}
		g.topologyKey = key
	}
	switch d := pg.Spec.DisruptionMode; {
	case d == nil: // the API's default
		g.disruption = core.DisruptionSingle
	case d.Single != nil && d.All != nil:
		return g, fmt.Errorf("%s: spec.disruptionMode sets both single and all; exactly one is allowed", name)
	case d.Single != nil:
		g.disruption = core.DisruptionSingle
	case d.All != nil:
		g.disruption = core.DisruptionAll
	default:
		return g, fmt.Errorf("%s: spec.disruptionMode sets neither single nor all", name)
	}
	g.priority, g.priorityClass = pg.Spec.Priority, pg.Spec.PriorityClassName
	if p := pg.Spec.PreemptionPolicy; p != nil {
		switch *p {
		case schedulingv1beta1.PreemptNever:
			g.neverEvicts = new(true)
		case schedulingv1beta1.PreemptLowerPriority:
			g.neverEvicts = new(false)
		default:
			return g, fmt.Errorf("%s: spec.preemptionPolicy %q is not %s or %s", name, *p, schedulingv1beta1.PreemptLowerPriority, schedulingv1beta1.PreemptNever)
		}
	}
	return g, nil
}

// upstreamGroupName is the upstream PodGroup pod names, "" for none.
func upstreamGroupName(pod *v1.Pod) string {
	if sg := pod.Spec.SchedulingGroup; sg != nil && sg.PodGroupName != nil {
		return *sg.PodGroupName
	}
	return ""
}

// getUpstreamGroup returns pod's upstream PodGroup, or why its pod waits:
// the API is not watched, or the PodGroup does not exist (yet: a
// controller may create it after its pods).
func (s *Scheduler) getUpstreamGroup(pod *v1.Pod, name string) (*schedulingv1beta1.PodGroup, string) {
	if s.upstreamLister == nil {
		return nil, fmt.Sprintf("pod names PodGroup %s in spec.schedulingGroup, but scheduling.k8s.io/v1beta1 PodGroups were not served when tessera-scheduler started", name)
	}
	pg, err := s.upstreamLister.PodGroups(pod.Namespace).Get(name)
	if err != nil {
		return nil, fmt.Sprintf("waiting for PodGroup %s/%s (scheduling.k8s.io), named in spec.schedulingGroup: it does not exist yet", pod.Namespace, name)
	}
	return pg, ""
}

// upstreamGroupMissing says why a pending pod of ours waits for its upstream
// PodGroup, "" when it names none or it exists. It is asked before the
// pod's claims: kube-controller-manager creates a member's claims only once
// its PodGroup exists, and "claim not created yet" would hide the cause.
func (s *Scheduler) upstreamGroupMissing(pod *v1.Pod, ours bool) string {
	name := upstreamGroupName(pod)
	if !ours || name == "" {
		return ""
	}
	_, why := s.getUpstreamGroup(pod, name)
	return why
}

// upstreamJob makes job the gang of pod's upstream PodGroup: its name,
// minimum, disruption, priority and preemption policy. The queue stays the
// pod's. It returns why the pod waits instead, "" when it may be scheduled.
func (s *Scheduler) upstreamJob(pod *v1.Pod, name string, job *core.Job, topology func(key string) *core.TopologyConstraint) string {
	pg, why := s.getUpstreamGroup(pod, name)
	if pg == nil {
		return why
	}
	g, err := readUpstreamGroup(pg)
	if err != nil {
		return err.Error()
	}
	job.Name = upstreamJobPrefix + pod.Namespace + "/" + name
	job.MinMember = g.minMember
	job.Disruption = g.disruption
	job.CreatedAt = pg.CreationTimestamp.Time
	if g.topologyKey != "" {
		job.Topology = topology(g.topologyKey)
	}
	switch {
	case g.priority != nil:
		job.Priority = *g.priority
	case g.priorityClass != "":
		pc, err := s.priorityLister.Get(g.priorityClass)
		if err != nil {
			return fmt.Sprintf("PodGroup %s/%s (scheduling.k8s.io): PriorityClass %s not found", pod.Namespace, name, g.priorityClass)
		}
		job.Priority = pc.Value
	}
	if g.neverEvicts != nil {
		job.NeverEvicts = *g.neverEvicts
	}
	return ""
}
