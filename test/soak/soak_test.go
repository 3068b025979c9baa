package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/test/controlplane"
)

// Environment of the soak.
const (
	// EnvDuration sets the soak's length (a Go duration; default
	// defaultDuration): chaos, then a quiet period in which everything
	// must settle. `make soak DURATION=30m` sets it.
	EnvDuration = "TESSERA_SOAK_DURATION"
	// EnvSeed replays a run: the same seed gives the same operations in
	// the same order (their timing, and so the cluster's answers, vary).
	EnvSeed = "TESSERA_SOAK_SEED"
)

const (
	defaultDuration = 2*time.Minute + 30*time.Second
	// quiet is the end of the run without kills: longer than the gang
	// window and the pending grace, so every invariant must hold by
	// then without an excuse.
	quiet = gangWindow + 5*time.Second
	// probeTimeout: after the chaos, a GPU-less pod must be bound within
	// this (the controller is alive and schedules).
	probeTimeout = 30 * time.Second
	// setupBudget bounds the set-up and the final checks, beyond the
	// soak's duration.
	setupBudget = 10 * time.Minute
)

// stats are the soak's counts, printed at the end.
type stats struct {
	events, podsCreated, podsDeleted, podsGone, gangsCreated, gangsDeleted int
	controllerKills, nodeKills, apiRestarts, restarts, exits               int
	checks, checksSkipped, violations, apiErrors                           int
	boundSeen                                                              map[string]bool
}

// soak is one run.
type soak struct {
	t     *testing.T
	c     *cluster
	rng   *rand.Rand
	seed  uint64
	start time.Time
	work  workload
	stats stats
	check *Checker
	// log is the recent event log, printed with a violation.
	log []string
	// lastDisruption is when a controller replica or the API server was
	// last killed or restarted (see Checker.Check).
	lastDisruption time.Time
	// down are the killed processes and the event number at which each
	// comes back.
	down map[*controlplane.Child]int
	// restartAPI stops the API server for a while and starts it again;
	// nil when the harness cannot.
	restartAPI func(ctx context.Context, down time.Duration) error
}

// TestSoak is the chaos soak (README.md). Plain `go test` runs the short
// version; TESSERA_SOAK_DURATION lengthens it and TESSERA_SOAK_SEED
// replays a seed.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real control plane, kwok nodes with tessera-node processes and two tessera-controller replicas for minutes; skipped with -short")
	}
	duration, seed := soakSettings(t)
	t.Logf("soak: seed %d, duration %v (replay: %s=%d)", seed, duration, EnvSeed, seed)
	// The soak bounds itself (make soak turns go test's timeout off): a
	// hang fails here instead of running on.
	ctx, cancel := context.WithTimeout(t.Context(), duration+setupBudget)
	defer cancel()
	s := &soak{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x7e55e7a)),
		check: NewChecker(pendingGrace, gangWindow), down: map[*controlplane.Child]int{},
		stats: stats{boundSeen: map[string]bool{}}}
	s.c = startCluster(t, ctx)
	s.restartAPI = func(ctx context.Context, down time.Duration) error {
		if err := s.c.cp.StopAPIServer(true); err != nil {
			return err
		}
		time.Sleep(down)
		return s.c.cp.StartAPIServer(ctx)
	}
	s.start = time.Now()
	defer func() { t.Log(s.summary()) }()

	chaosEnd := s.start.Add(duration - quiet)
	for time.Now().Before(chaosEnd) && !t.Failed() {
		s.event(ctx)
		if !s.verify(ctx) {
			return
		}
		time.Sleep(s.pause())
	}
	s.calm(ctx)
}

// soakSettings reads the duration and seed from the environment.
func soakSettings(t *testing.T) (time.Duration, uint64) {
	duration := defaultDuration
	if v := os.Getenv(EnvDuration); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < quiet+30*time.Second {
			t.Fatalf("%s=%q: want a duration of at least %v (the quiet end alone takes %v)", EnvDuration, v, quiet+30*time.Second, quiet)
		}
		duration = d
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(EnvSeed); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want an unsigned integer", EnvSeed, v)
		}
		seed = n
	}
	return duration, seed
}

// event runs one random event (after restarting what is due).
func (s *soak) event(ctx context.Context) {
	s.stats.events++
	for c, at := range s.down {
		if s.stats.events >= at {
			s.restart(c)
		}
	}
	s.restartExited()
	type op struct {
		weight  int
		run     func(context.Context) string
		creates bool
	}
	ops := []op{
		{36, s.createPod, true}, {8, s.createGang, true}, {24, s.deletePod, false}, {4, s.deleteGangMember, false},
		{6, s.deleteGang, false}, {4, s.killController, false}, {4, s.killNode, false}, {2, s.restartAPIServer, false},
	}
	total := 0
	for _, o := range ops {
		total += o.weight
	}
	r := s.rng.IntN(total)
	for _, o := range ops {
		if r < o.weight {
			run := o.run
			if o.creates && s.work.live() >= maxLivePods {
				run = s.deletePod // full: make room instead
			}
			s.record(run(ctx))
			return
		}
		r -= o.weight
	}
}

// record adds an event to the log.
func (s *soak) record(desc string) {
	line := fmt.Sprintf("[%7.1fs] #%d %s", time.Since(s.start).Seconds(), s.stats.events, desc)
	s.log = append(s.log, line)
	if len(s.log) > 40 {
		s.log = s.log[1:]
	}
	if testing.Verbose() {
		s.t.Log(line)
	}
}

// killController kills a random running replica; it comes back after 2–8
// events.
func (s *soak) killController(context.Context) string {
	// The leader, three times in four, when one answers that it leads.
	pick := s.rng.IntN(len(s.c.replicas))
	if s.rng.IntN(4) > 0 {
		for i, r := range s.c.replicas {
			if _, down := s.down[r.Child]; !down && r.IsLeader() {
				pick = i
			}
		}
	}
	return s.kill(s.c.replicas[pick].Child, "controller", &s.stats.controllerKills, true)
}

// killNode kills a random running tessera-node; it comes back after 2–8
// events.
func (s *soak) killNode(context.Context) string {
	return s.kill(s.c.nodes[s.rng.IntN(len(s.c.nodes))], "tessera-node", &s.stats.nodeKills, false)
}

func (s *soak) kill(c *controlplane.Child, what string, count *int, disrupts bool) string {
	back := s.stats.events + 2 + s.rng.IntN(7)
	if _, ok := s.down[c]; ok {
		return fmt.Sprintf("kill %s: %s is down already", what, c.Name)
	}
	c.Kill()
	*count++
	s.down[c] = back
	if disrupts {
		s.lastDisruption = time.Now()
	}
	return fmt.Sprintf("kill -9 %s (back at event #%d)", c.Name, back)
}

func (s *soak) restart(c *controlplane.Child) {
	delete(s.down, c)
	if err := c.Restart(); err != nil {
		s.t.Fatalf("restarting %s: %v", c.Name, err)
	}
	s.stats.restarts++
	if strings.HasPrefix(c.Name, "controller") {
		s.lastDisruption = time.Now()
	}
	s.record("restart " + c.Name)
}

// restartExited starts again, as a kubelet would, every process that
// ended on its own: a replica that could not renew its Lease (the API
// server was down past its renew deadline) exits by design.
func (s *soak) restartExited() {
	all := slices.Clone(s.c.nodes)
	for _, r := range s.c.replicas {
		all = append(all, r.Child)
	}
	for _, c := range all {
		if _, down := s.down[c]; down {
			continue
		}
		if done, code := c.Exited(); done {
			s.stats.exits++
			s.record(fmt.Sprintf("%s exited by itself (code %d); last line: %s", c.Name, code, lastLine(c.Tail(1))))
			s.restart(c)
		}
	}
}

func lastLine(s string) string {
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// restartAPIServer kills the API server, keeps it down 0.5–3 s and starts
// it again.
func (s *soak) restartAPIServer(ctx context.Context) string {
	down := time.Duration(500+s.rng.IntN(2500)) * time.Millisecond
	if s.restartAPI == nil {
		return "restart API server: not supported by the harness yet"
	}
	s.lastDisruption = time.Now()
	if err := s.restartAPI(ctx, down); err != nil {
		s.t.Fatalf("restarting the API server: %v", err)
	}
	s.stats.apiRestarts++
	s.lastDisruption = time.Now()
	return fmt.Sprintf("kill -9 kube-apiserver, down %v, started again", down)
}

// verify checks the invariants on a fresh picture; false (and the test
// failed) on a violation.
func (s *soak) verify(ctx context.Context) bool {
	st, err := s.snapshot(ctx)
	if err != nil {
		s.stats.checksSkipped++
		s.record(fmt.Sprintf("check skipped: %v", err))
		return true
	}
	s.stats.checks++
	for _, p := range st.Pods {
		if p.Spec.NodeName != "" {
			s.stats.boundSeen[string(p.UID)] = true
		}
	}
	vs := s.check.Check(st, s.lastDisruption)
	if len(vs) == 0 {
		return true
	}
	s.stats.violations += len(vs)
	s.t.Errorf("%s", s.report(st, vs))
	return false
}

// calm ends the run: every killed process back, then a quiet period
// with checks every 2 s, a final check, and a GPU-less probe pod that
// must be bound.
func (s *soak) calm(ctx context.Context) {
	for c := range s.down {
		s.restart(c)
	}
	s.restartExited()
	s.record(fmt.Sprintf("chaos over; quiet for %v", quiet))
	end := time.Now().Add(quiet)
	for time.Now().Before(end) {
		s.restartExited()
		if !s.verify(ctx) {
			return
		}
		time.Sleep(2 * time.Second)
	}
	s.probe(ctx)
	if !s.verify(ctx) {
		return
	}
	if len(s.stats.boundSeen) == 0 {
		s.t.Errorf("no pod was ever seen bound: the soak checked an idle cluster")
	}
}

// probe creates a pod without GPUs and waits for it to be bound.
func (s *soak) probe(ctx context.Context) {
	p := podSpec(s.c.ns, "probe", podKind{name: "cpu"}, "team-a", "tessera-build", "")
	p.Spec.Containers[0].Resources.Limits = nil
	if _, err := s.c.client.CoreV1().Pods(s.c.ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		s.t.Errorf("creating the probe pod: %v", err)
		return
	}
	deadline := time.Now().Add(probeTimeout)
	for time.Now().Before(deadline) {
		got, err := s.c.client.CoreV1().Pods(s.c.ns).Get(ctx, "probe", metav1.GetOptions{})
		if err == nil && got.Spec.NodeName != "" {
			s.record("probe pod bound on " + got.Spec.NodeName)
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	s.t.Errorf("after the chaos, a pod without GPUs was not bound within %v: no replica schedules\nrecent events:\n%s", probeTimeout, strings.Join(s.log, "\n"))
}

// snapshot reads the cluster at one etcd revision: the pod list's, and
// every other list at exactly that revision.
func (s *soak) snapshot(ctx context.Context) (*State, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	c := s.c
	pods, err := c.client.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	st := &State{At: time.Now(), Revision: pods.ResourceVersion, Pods: pods.Items}
	at := metav1.ListOptions{ResourceVersion: pods.ResourceVersion, ResourceVersionMatch: metav1.ResourceVersionMatchExact}
	claims, err := c.client.ResourceV1().ResourceClaims(c.ns).List(ctx, at)
	if err != nil {
		return nil, fmt.Errorf("listing claims: %w", err)
	}
	st.Claims = claims.Items
	sl, err := c.client.ResourceV1().ResourceSlices().List(ctx, at)
	if err != nil {
		return nil, fmt.Errorf("listing slices: %w", err)
	}
	st.Slices = sl.Items
	pcs, err := c.client.SchedulingV1().PriorityClasses().List(ctx, at)
	if err != nil {
		return nil, fmt.Errorf("listing priority classes: %w", err)
	}
	st.PriorityClasses = pcs.Items
	pgs, err := c.dyn.Resource(kube.PodGroupGVR).Namespace(c.ns).List(ctx, at)
	if err != nil {
		return nil, fmt.Errorf("listing PodGroups: %w", err)
	}
	for _, u := range pgs.Items {
		var pg schedv1.PodGroup
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &pg); err != nil {
			return nil, fmt.Errorf("PodGroup %s: %w", u.GetName(), err)
		}
		st.PodGroups = append(st.PodGroups, pg)
	}
	qs, err := c.dyn.Resource(kube.QueueGVR).List(ctx, at)
	if err != nil {
		return nil, fmt.Errorf("listing Queues: %w", err)
	}
	for _, u := range qs.Items {
		var q schedv1.Queue
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &q); err != nil {
			return nil, fmt.Errorf("Queue %s: %w", u.GetName(), err)
		}
		st.Queues = append(st.Queues, q)
	}
	return st, nil
}

// report says which invariants broke, shows the objects involved and the
// recent events, and how to replay the seed.
func (s *soak) report(st *State, vs []Violation) string {
	var b strings.Builder
	fmt.Fprintf(&b, "INVARIANT BROKEN at %.1fs, event #%d, revision %s (seed %d; replay: %s=%d)\n",
		time.Since(s.start).Seconds(), s.stats.events, st.Revision, s.seed, EnvSeed, s.seed)
	seen := map[string]bool{}
	for _, v := range vs {
		fmt.Fprintf(&b, "  %s\n", v)
	}
	b.WriteString("objects involved:\n")
	for _, v := range vs {
		for _, o := range v.Objects {
			if !seen[o] {
				seen[o] = true
				fmt.Fprintf(&b, "  %s\n", describeObject(st, o))
			}
		}
	}
	b.WriteString("recent events:\n")
	for _, l := range s.log {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	return b.String()
}

// describeObject is one line about an object a violation names.
func describeObject(st *State, obj string) string {
	kind, key, _ := strings.Cut(obj, " ")
	ns, name, _ := strings.Cut(key, "/")
	switch kind {
	case "pod":
		for _, p := range st.Pods {
			if p.Namespace == ns && p.Name == name {
				return describePod(&p)
			}
		}
	case "claim":
		for _, c := range st.Claims {
			if c.Namespace == ns && c.Name == name {
				return describeClaim(&c)
			}
		}
	case "podgroup":
		for _, pg := range st.PodGroups {
			if pg.Namespace == ns && pg.Name == name {
				return fmt.Sprintf("%s: minMember %d, queue %s, %s, phase %s", obj, pg.Spec.MinMember, pg.Spec.Queue, pg.Spec.PriorityClassName, pg.Status.Phase)
			}
		}
	case "queue":
		for _, q := range st.Queues {
			if q.Name == key && q.Spec.Resources.GPU != nil {
				g := q.Spec.Resources.GPU
				return fmt.Sprintf("%s: parent %q, gpu quota %v, limit %v, status %v", obj, q.Spec.Parent, g.Quota, g.Limit, q.Status.Resources["gpu"])
			}
		}
	case "gpu":
		return obj
	}
	return obj + ": not in the picture"
}

func describePod(p *corev1.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s/%s: uid %s, kind %s, queue %s, priority %d, node %q, phase %s", p.Namespace, p.Name, p.UID,
		p.Labels["soak/kind"], p.Labels[kube.LabelQueue], ptr.Deref(p.Spec.Priority, 0), p.Spec.NodeName, p.Status.Phase)
	if p.DeletionTimestamp != nil {
		fmt.Fprintf(&b, ", terminating since %s", p.DeletionTimestamp.Format(time.TimeOnly))
	}
	if g := p.Annotations[kube.AnnotationPodGroup]; g != "" {
		fmt.Fprintf(&b, ", gang %s", g)
	}
	if a := p.Annotations[kube.AnnotationAssignment]; a != "" {
		fmt.Fprintf(&b, ", assignment %s", a)
	}
	fmt.Fprintf(&b, ", claims %v", podClaimNames(p))
	if r := pendingReason(p); r != "" {
		fmt.Fprintf(&b, ", pending: %q", r)
	}
	return b.String()
}

func describeClaim(c *resourceapi.ResourceClaim) string {
	var b strings.Builder
	fmt.Fprintf(&b, "claim %s/%s:", c.Namespace, c.Name)
	if c.DeletionTimestamp != nil {
		b.WriteString(" deleting,")
	}
	if a := c.Status.Allocation; a != nil {
		fmt.Fprintf(&b, " allocated on %s", allocationNode(a))
		for _, r := range a.Devices.Results {
			mem := r.ConsumedCapacity["memory"]
			fmt.Fprintf(&b, " %s/%s(%s %s)", r.Pool, r.Device, claimMode(c, r.Request), mem.String())
		}
	} else {
		b.WriteString(" not allocated")
	}
	var holders []string
	for _, r := range c.Status.ReservedFor {
		holders = append(holders, r.Name+"/"+string(r.UID))
	}
	fmt.Fprintf(&b, ", reserved for %v", holders)
	return b.String()
}

// summary is the end-of-run report.
func (s *soak) summary() string {
	st := s.stats
	apiRestarts := strconv.Itoa(st.apiRestarts)
	if s.restartAPI == nil {
		apiRestarts = "not supported"
	}
	return fmt.Sprintf("soak summary (seed %d, %v): events %d; pods created %d, deleted %d (%d already gone: evicted), seen bound %d; gangs created %d, deleted %d; "+
		"kills: controller replicas %d, tessera-node %d, API server restarts %s; processes restarted %d (%d had exited by themselves); "+
		"invariant checks %d (skipped %d: API unreachable), violations %d; API errors in events %d",
		s.seed, time.Since(s.start).Round(time.Second), st.events, st.podsCreated, st.podsDeleted, st.podsGone, len(st.boundSeen),
		st.gangsCreated, st.gangsDeleted, st.controllerKills, st.nodeKills, apiRestarts, st.restarts, st.exits,
		st.checks, st.checksSkipped, st.violations, st.apiErrors)
}
