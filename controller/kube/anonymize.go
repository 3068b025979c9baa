package kube

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/internal/draname"
)

// Anonymized is an anonymised cycle snapshot: the dump, the key that maps
// it back (keep it apart from the dump), and what could not be renamed
// safely (CEL literals kept as they were).
type Anonymized struct {
	Dump     *Dump
	Key      *AnonymizeKey
	Warnings []string
}

// Anonymize renames every user-chosen name in d consistently and in order
// (anonymize_names.go; docs/DESIGN.md says what is renamed and what is
// kept): namespaces, objects' names, node names and hostnames, queues,
// PodGroups, claims, label values of user-defined and name-carrying keys,
// selectors and CEL string literals that are whole names, owner
// references, the carried state and the decisions. d is not changed.
func Anonymize(d *Dump) (*Anonymized, error) {
	c := collectNames(d)
	key, err := newAnonymizeKey(c.segs)
	if err != nil {
		return nil, err
	}
	return anonymizeWith(d, c.names, key), nil
}

// collectNames walks d for the names Anonymize renames.
func collectNames(d *Dump) *anonymizer {
	c := &anonymizer{collect: true, names: map[string]bool{}, segs: map[string]bool{}}
	c.dump(cloneDump(d))
	return c
}

// anonymizeWith renames a copy of d with key.
func anonymizeWith(d *Dump, names map[string]bool, key *AnonymizeKey) *Anonymized {
	out := cloneDump(d)
	a := &anonymizer{names: names, key: key}
	a.dump(out)
	return &Anonymized{Dump: out, Key: key, Warnings: a.warnings}
}

func cloneDump(d *Dump) *Dump {
	b, err := MarshalDump(d)
	if err != nil {
		panic(fmt.Sprintf("cloning a cycle snapshot: %v", err))
	}
	var c Dump
	if err := yaml.Unmarshal(b, &c); err != nil {
		panic(fmt.Sprintf("cloning a cycle snapshot: %v", err))
	}
	return &c
}

// anonymizer walks a dump twice: collecting the names (collect), then
// renaming them with key.
type anonymizer struct {
	collect  bool
	names    map[string]bool // whole renamed strings, for CEL and reasons
	segs     map[string]bool
	key      *AnonymizeKey
	warnings []string
}

// name renames one user-chosen name (or ns/name key) in place.
func (a *anonymizer) name(p *string) {
	if p == nil || *p == "" {
		return
	}
	if a.collect {
		a.names[*p] = true
		for _, s := range segments(*p) {
			a.segs[s] = true
		}
		return
	}
	*p = a.key.Anonymize(*p)
}

// uid renames a UID like a name: a cluster's are random, a hand-made
// file's may spell names.
func (a *anonymizer) uid(u *types.UID) {
	s := string(*u)
	a.name(&s)
	*u = types.UID(s)
}

func (a *anonymizer) str(s string) string { a.name(&s); return s }

func (a *anonymizer) ptr(p *string) {
	if p != nil {
		a.name(p)
	}
}

// text renames, in free text (a reason), each word that is a whole
// renamed name or a '/'-joined key of them. Other words stay: a word that
// only looks like a name is not touched.
func (a *anonymizer) text(s string) string {
	if a.collect || s == "" {
		return s
	}
	isWordByte := func(c byte) bool { return strings.IndexByte(" \t\n'\"(),;:[]{}=", c) < 0 }
	return mapRuns(s, isWordByte, func(w string) string {
		core := strings.TrimRight(w, ".")
		if a.isName(core) {
			return a.key.Anonymize(core) + w[len(core):]
		}
		return w
	})
}

func (a *anonymizer) isName(w string) bool {
	if w == "" {
		return false
	}
	if a.names[w] {
		return true
	}
	parts := strings.Split(w, "/")
	for _, p := range parts {
		if !a.names[p] && p != externalQueue {
			return false
		}
	}
	return len(parts) > 1
}

func (a *anonymizer) warn(format string, args ...any) {
	if !a.collect {
		a.warnings = append(a.warnings, fmt.Sprintf(format, args...))
	}
}

// nameCarryingKeys are well-known label and annotation keys whose values
// are names: they are renamed like the names.
var nameCarryingKeys = map[string]bool{
	v1.LabelHostname: true, "kubernetes.io/metadata.name": true, LabelQueue: true,
	v1.LabelTopologyZone: true, v1.LabelTopologyRegion: true, v1.LabelFailureDomainBetaZone: true, v1.LabelFailureDomainBetaRegion: true,
	"batch.kubernetes.io/job-name": true, "batch.kubernetes.io/controller-uid": true,
	"statefulset.kubernetes.io/pod-name": true, "kueue.x-k8s.io/queue-name": true,
	AnnotationPodGroup: true, AnnotationPodSubGroup: true, AnnotationTopology: true,
	"volume.kubernetes.io/selected-node": true,
}

// wellKnownDomain: keys of these domains are Kubernetes', Tessera's or
// NVIDIA's own; their values are kept unless the key carries a name.
func wellKnownDomain(key string) bool {
	i := strings.LastIndexByte(key, '/')
	if i < 0 {
		return false
	}
	d := key[:i]
	for _, w := range []string{"kubernetes.io", "k8s.io", "tessera.dev", "nvidia.com"} {
		if d == w || strings.HasSuffix(d, "."+w) {
			return true
		}
	}
	return false
}

// renamesValue says whether a label's (or taint's) value under key is
// renamed: a name-carrying key, or a user-defined one.
func renamesValue(key string) bool { return nameCarryingKeys[key] || !wellKnownDomain(key) }

func (a *anonymizer) value(key string, p *string) {
	if renamesValue(key) {
		a.name(p)
	}
}

func (a *anonymizer) labels(m map[string]string) {
	for k, v := range m {
		a.value(k, &v)
		m[k] = v
	}
}

// annotations keeps only well-known keys (the adapter reads nothing
// else), renaming the name-carrying ones' values.
func (a *anonymizer) annotations(m map[string]string) {
	for k, v := range m {
		if !wellKnownDomain(k) {
			delete(m, k)
			continue
		}
		if nameCarryingKeys[k] {
			a.name(&v)
			m[k] = v
		}
	}
}

func (a *anonymizer) meta(m *metav1.ObjectMeta) {
	a.name(&m.Name)
	a.name(&m.Namespace)
	a.name(&m.GenerateName)
	a.labels(m.Labels)
	a.annotations(m.Annotations)
	m.ManagedFields = nil
	a.uid(&m.UID)
	for i := range m.OwnerReferences {
		a.name(&m.OwnerReferences[i].Name)
		a.uid(&m.OwnerReferences[i].UID)
	}
}

func (a *anonymizer) selector(s *metav1.LabelSelector) {
	if s == nil {
		return
	}
	a.labels(s.MatchLabels)
	for i := range s.MatchExpressions {
		e := &s.MatchExpressions[i]
		for j := range e.Values {
			a.value(e.Key, &e.Values[j])
		}
	}
}

func (a *anonymizer) nodeSelector(s *v1.NodeSelector) {
	if s == nil {
		return
	}
	for i := range s.NodeSelectorTerms {
		a.nodeTerm(&s.NodeSelectorTerms[i])
	}
}

func (a *anonymizer) nodeTerm(t *v1.NodeSelectorTerm) {
	for i := range t.MatchExpressions {
		e := &t.MatchExpressions[i]
		for j := range e.Values {
			a.value(e.Key, &e.Values[j])
		}
	}
	for i := range t.MatchFields {
		e := &t.MatchFields[i]
		for j := range e.Values {
			a.name(&e.Values[j]) // metadata.name: a node's name
		}
	}
}

func (a *anonymizer) dump(d *Dump) {
	a.objects(&d.Objects)
	a.state(&d.State)
	if d.Decisions != nil {
		d.Decisions = renameDecisions(d.Decisions, a.str, a.text)
		sortDecisions(d.Decisions)
	}
}

func sortDecisions(d *Decisions) {
	sort.Slice(d.Binds, func(i, j int) bool { return d.Binds[i].Pod < d.Binds[j].Pod })
	sort.Slice(d.Evictions, func(i, j int) bool { return d.Evictions[i].Pod < d.Evictions[j].Pod })
	sort.Slice(d.Pending, func(i, j int) bool { return d.Pending[i].Pod < d.Pending[j].Pod })
}

func (a *anonymizer) state(s *DumpState) {
	renameTimes := func(m map[string]time.Time) map[string]time.Time {
		out := make(map[string]time.Time, len(m))
		for k, v := range m {
			out[a.str(k)] = v
		}
		return out
	}
	s.BelowMinMemberSince = renameTimes(s.BelowMinMemberSince)
	s.EvictionBlockedUntil = renameTimes(s.EvictionBlockedUntil)
	noms := make(map[string]DumpNomination, len(s.Nominations))
	for k, n := range s.Nominations {
		a.name(&n.Node)
		a.uid(&n.UID)
		for i := range n.Victims {
			a.name(&n.Victims[i])
		}
		noms[a.str(k)] = n
	}
	s.Nominations = noms
	await := make(map[string]string, len(s.AwaitGrouper))
	for k, why := range s.AwaitGrouper {
		await[a.str(k)] = a.text(why)
	}
	s.AwaitGrouper = await
	if s.Usage != nil {
		usage := make(map[string]core.Resources, len(s.Usage))
		for q, r := range s.Usage {
			usage[a.str(q)] = r
		}
		s.Usage = usage
	}
}

func (a *anonymizer) objects(o *DumpObjects) {
	for i := range o.Namespaces {
		a.meta(&o.Namespaces[i].ObjectMeta)
	}
	for i := range o.Nodes {
		a.node(&o.Nodes[i])
	}
	for i := range o.Pods {
		a.pod(&o.Pods[i])
	}
	for i := range o.ResourceClaims {
		a.claim(&o.ResourceClaims[i])
	}
	for i := range o.ResourceSlices {
		a.slice(&o.ResourceSlices[i])
	}
	for i := range o.DeviceClasses {
		c := &o.DeviceClasses[i]
		for j := range c.Spec.Selectors {
			a.cel(&c.Spec.Selectors[j], "DeviceClass "+c.Name)
		}
	}
	a.storage(o)
	if o.UpstreamPodGroups != nil {
		for i := range *o.UpstreamPodGroups {
			a.meta(&(*o.UpstreamPodGroups)[i].ObjectMeta)
		}
	}
	for _, q := range o.Queues {
		a.unstructured(q, []string{"spec", "parent"})
	}
	for _, g := range o.PodGroups {
		a.unstructured(g, []string{"spec", "queue"}, []string{"spec", "topology", "name"})
		a.subGroups(g)
		delete(g, "status")
	}
	for _, t := range o.Topologies {
		a.unstructured(t)
	}
}

func (a *anonymizer) node(n *v1.Node) {
	a.meta(&n.ObjectMeta)
	a.name(&n.Spec.ProviderID)
	n.Spec.PodCIDR, n.Spec.PodCIDRs = "", nil
	for i := range n.Spec.Taints {
		a.value(n.Spec.Taints[i].Key, &n.Spec.Taints[i].Value)
	}
	for i := range n.Status.Addresses {
		a.name(&n.Status.Addresses[i].Address)
	}
	n.Status.Images = nil
	info := &n.Status.NodeInfo
	info.MachineID, info.SystemUUID, info.BootID = "", "", ""
}

func (a *anonymizer) pod(p *v1.Pod) {
	a.meta(&p.ObjectMeta)
	s := &p.Spec
	for _, f := range []*string{&s.NodeName, &s.Hostname, &s.Subdomain, &s.ServiceAccountName, &s.DeprecatedServiceAccount} {
		a.name(f)
	}
	if s.SchedulingGroup != nil {
		a.ptr(s.SchedulingGroup.PodGroupName)
	}
	a.labels(s.NodeSelector)
	a.affinity(s.Affinity)
	for i := range s.Tolerations {
		a.value(s.Tolerations[i].Key, &s.Tolerations[i].Value)
	}
	for i := range s.TopologySpreadConstraints {
		a.selector(s.TopologySpreadConstraints[i].LabelSelector)
	}
	for i := range s.InitContainers {
		a.name(&s.InitContainers[i].Image)
	}
	for i := range s.Containers {
		a.name(&s.Containers[i].Image)
	}
	for i := range s.EphemeralContainers {
		a.name(&s.EphemeralContainers[i].Image)
	}
	for i := range s.Volumes {
		vs := &s.Volumes[i].VolumeSource
		if vs.PersistentVolumeClaim != nil {
			a.name(&vs.PersistentVolumeClaim.ClaimName)
		}
		if vs.ConfigMap != nil {
			a.name(&vs.ConfigMap.Name)
		}
		if vs.HostPath != nil {
			a.name(&vs.HostPath.Path)
		}
		if vs.Ephemeral != nil && vs.Ephemeral.VolumeClaimTemplate != nil {
			t := vs.Ephemeral.VolumeClaimTemplate
			a.ptr(t.Spec.StorageClassName)
			a.selector(t.Spec.Selector)
			a.labels(t.Labels)
			a.annotations(t.Annotations)
		}
	}
	for i := range s.ResourceClaims {
		a.ptr(s.ResourceClaims[i].ResourceClaimName)
		a.ptr(s.ResourceClaims[i].ResourceClaimTemplateName)
	}
	st := &p.Status
	a.name(&st.NominatedNodeName)
	st.Message, st.HostIP, st.HostIPs, st.PodIP, st.PodIPs = "", "", nil, "", nil
	for i := range st.Conditions {
		st.Conditions[i].Message = ""
	}
	for i := range st.ResourceClaimStatuses {
		a.ptr(st.ResourceClaimStatuses[i].ResourceClaimName)
	}
}

func (a *anonymizer) affinity(af *v1.Affinity) {
	if af == nil {
		return
	}
	if na := af.NodeAffinity; na != nil {
		a.nodeSelector(na.RequiredDuringSchedulingIgnoredDuringExecution)
		for i := range na.PreferredDuringSchedulingIgnoredDuringExecution {
			a.nodeTerm(&na.PreferredDuringSchedulingIgnoredDuringExecution[i].Preference)
		}
	}
	term := func(t *v1.PodAffinityTerm) {
		a.selector(t.LabelSelector)
		a.selector(t.NamespaceSelector)
		for i := range t.Namespaces {
			a.name(&t.Namespaces[i])
		}
	}
	terms := func(req []v1.PodAffinityTerm, pref []v1.WeightedPodAffinityTerm) {
		for i := range req {
			term(&req[i])
		}
		for i := range pref {
			term(&pref[i].PodAffinityTerm)
		}
	}
	if pa := af.PodAffinity; pa != nil {
		terms(pa.RequiredDuringSchedulingIgnoredDuringExecution, pa.PreferredDuringSchedulingIgnoredDuringExecution)
	}
	if pa := af.PodAntiAffinity; pa != nil {
		terms(pa.RequiredDuringSchedulingIgnoredDuringExecution, pa.PreferredDuringSchedulingIgnoredDuringExecution)
	}
}

// renamedAttributes are device attributes that identify hardware or name
// objects; others (product, architecture, memory) are kept.
var renamedAttributes = map[resourceapi.QualifiedName]bool{
	draname.AttrUUID: true, draname.AttrDevicePluginPod: true, draname.AttrClique: true, draname.AttrNVLinkDomain: true,
}

func (a *anonymizer) slice(s *resourceapi.ResourceSlice) {
	a.meta(&s.ObjectMeta)
	a.ptr(s.Spec.NodeName)
	a.name(&s.Spec.Pool.Name)
	a.nodeSelector(s.Spec.NodeSelector)
	for i := range s.Spec.Devices {
		for k, v := range s.Spec.Devices[i].Attributes {
			if renamedAttributes[k] && v.StringValue != nil {
				a.ptr(v.StringValue)
				s.Spec.Devices[i].Attributes[k] = v
			}
		}
	}
}

func (a *anonymizer) claim(c *resourceapi.ResourceClaim) {
	a.meta(&c.ObjectMeta)
	what := "ResourceClaim " + c.Namespace + "/" + c.Name
	if !a.collect {
		what = "ResourceClaim " + a.key.Anonymize(c.Namespace+"/"+c.Name)
	}
	for i := range c.Spec.Devices.Requests {
		r := &c.Spec.Devices.Requests[i]
		if r.Exactly != nil {
			for j := range r.Exactly.Selectors {
				a.cel(&r.Exactly.Selectors[j], what)
			}
		}
		for k := range r.FirstAvailable {
			for j := range r.FirstAvailable[k].Selectors {
				a.cel(&r.FirstAvailable[k].Selectors[j], what)
			}
		}
	}
	st := &c.Status
	if st.Allocation != nil {
		for i := range st.Allocation.Devices.Results {
			a.name(&st.Allocation.Devices.Results[i].Pool)
		}
		a.nodeSelector(st.Allocation.NodeSelector)
	}
	for i := range st.ReservedFor {
		a.name(&st.ReservedFor[i].Name)
		a.uid(&st.ReservedFor[i].UID)
	}
	for i := range st.Devices {
		a.name(&st.Devices[i].Pool)
		st.Devices[i].NetworkData = nil
	}
}

// cel rewrites the string literals of a CEL selector that are whole
// renamed names; one that is not but holds a renamed segment is kept, with
// a warning (a replay may then differ on it).
func (a *anonymizer) cel(s *resourceapi.DeviceSelector, what string) {
	if s.CEL == nil || a.collect {
		return
	}
	out, lits, err := rewriteCELStrings(s.CEL.Expression, func(lit string) (string, bool) {
		if a.names[lit] {
			return a.key.Anonymize(lit), true
		}
		return lit, false
	})
	if err != nil {
		a.warn("%s: CEL selector kept as it is: %v", what, err)
		return
	}
	for _, l := range lits {
		if n := a.nameInside(l); n != "" {
			a.warn("%s: CEL string %q kept as it is: it holds the renamed name %q but is not a name; a replay may differ",
				what, l, a.key.Anonymize(n))
		}
	}
	s.CEL.Expression = out
}

// nameInside returns a renamed name that some run of whole segments of s
// spells (not one that is only a segment of a longer name), or "".
func (a *anonymizer) nameInside(s string) string {
	var starts, ends []int
	for i := 0; i < len(s); i++ {
		if s[i] >= '0' && (i == 0 || s[i-1] < '0') {
			starts = append(starts, i)
		}
		if s[i] >= '0' && (i == len(s)-1 || s[i+1] < '0') {
			ends = append(ends, i+1)
		}
	}
	for _, st := range starts {
		for _, e := range ends {
			if e > st && a.names[s[st:e]] && a.key.Anonymize(s[st:e]) != s[st:e] {
				return s[st:e]
			}
		}
	}
	return ""
}

func (a *anonymizer) storage(o *DumpObjects) {
	for i := range o.PersistentVolumeClaims {
		c := &o.PersistentVolumeClaims[i]
		a.meta(&c.ObjectMeta)
		a.name(&c.Spec.VolumeName)
		a.ptr(c.Spec.StorageClassName)
		a.selector(c.Spec.Selector)
		if c.Spec.DataSource != nil {
			a.name(&c.Spec.DataSource.Name)
		}
		c.Spec.DataSourceRef = nil
	}
	for i := range o.PersistentVolumes {
		a.pv(&o.PersistentVolumes[i])
	}
	for i := range o.StorageClasses {
		sc := &o.StorageClasses[i]
		a.meta(&sc.ObjectMeta)
		sc.Parameters = nil
		for j := range sc.AllowedTopologies {
			for k := range sc.AllowedTopologies[j].MatchLabelExpressions {
				e := &sc.AllowedTopologies[j].MatchLabelExpressions[k]
				for l := range e.Values {
					a.value(e.Key, &e.Values[l])
				}
			}
		}
	}
	for i := range o.CSINodes {
		n := &o.CSINodes[i]
		a.meta(&n.ObjectMeta)
		for j := range n.Spec.Drivers {
			a.name(&n.Spec.Drivers[j].NodeID)
		}
	}
	for i := range o.CSIStorageCapacities {
		c := &o.CSIStorageCapacities[i]
		a.meta(&c.ObjectMeta)
		a.name(&c.StorageClassName)
		a.selector(c.NodeTopology)
	}
}

func (a *anonymizer) pv(pv *v1.PersistentVolume) {
	a.meta(&pv.ObjectMeta)
	a.name(&pv.Spec.StorageClassName)
	if r := pv.Spec.ClaimRef; r != nil {
		a.name(&r.Name)
		a.name(&r.Namespace)
		a.uid(&r.UID)
	}
	if pv.Spec.NodeAffinity != nil {
		a.nodeSelector(pv.Spec.NodeAffinity.Required)
	}
	src := &pv.Spec.PersistentVolumeSource
	if src.CSI != nil {
		a.name(&src.CSI.VolumeHandle)
		src.CSI.VolumeAttributes, src.CSI.NodePublishSecretRef, src.CSI.NodeStageSecretRef = nil, nil, nil
		src.CSI.ControllerPublishSecretRef, src.CSI.ControllerExpandSecretRef, src.CSI.NodeExpandSecretRef = nil, nil, nil
	}
	if src.Local != nil {
		a.name(&src.Local.Path)
	}
	if src.HostPath != nil {
		a.name(&src.HostPath.Path)
	}
	if src.NFS != nil {
		a.name(&src.NFS.Server)
		a.name(&src.NFS.Path)
	}
}

// unstructured renames a Tessera object's metadata and the name fields at
// paths.
func (a *anonymizer) unstructured(obj map[string]any, paths ...[]string) {
	if md, ok := obj["metadata"].(map[string]any); ok {
		for _, f := range []string{"name", "namespace", "generateName", "uid"} {
			a.field(md, f)
		}
		delete(md, "managedFields")
		if l, ok := md["labels"].(map[string]any); ok {
			for k, v := range l {
				if s, ok := v.(string); ok {
					a.value(k, &s)
					l[k] = s
				}
			}
		}
		if an, ok := md["annotations"].(map[string]any); ok {
			for k, v := range an {
				s, _ := v.(string)
				if !wellKnownDomain(k) {
					delete(an, k)
				} else if nameCarryingKeys[k] {
					a.name(&s)
					an[k] = s
				}
			}
		}
		if refs, ok := md["ownerReferences"].([]any); ok {
			for _, r := range refs {
				if m, ok := r.(map[string]any); ok {
					a.field(m, "name")
					a.field(m, "uid")
				}
			}
		}
	}
	for _, p := range paths {
		m := obj
		for _, f := range p[:len(p)-1] {
			next, ok := m[f].(map[string]any)
			if !ok {
				m = nil
				break
			}
			m = next
		}
		if m != nil {
			a.field(m, p[len(p)-1])
		}
	}
}

func (a *anonymizer) field(m map[string]any, f string) {
	if s, ok := m[f].(string); ok {
		a.name(&s)
		m[f] = s
	}
}

func (a *anonymizer) subGroups(g map[string]any) {
	spec, _ := g["spec"].(map[string]any)
	subs, _ := spec["subGroups"].([]any)
	for _, s := range subs {
		if m, ok := s.(map[string]any); ok {
			a.field(m, "name")
			if t, ok := m["topology"].(map[string]any); ok {
				a.field(t, "name")
			}
		}
	}
}

// CheckAnonymized replays d and its anonymised copy and fails unless the
// copy's decisions, mapped back through the key, are d's: the renaming
// changed nothing the cycle decides on. It returns both replays' decisions.
func CheckAnonymized(ctx context.Context, d *Dump, an *Anonymized) (orig, anon *Decisions, err error) {
	want, err := Replay(ctx, cloneDump(d))
	if err != nil {
		return nil, nil, fmt.Errorf("replaying the original: %w", err)
	}
	got, err := Replay(ctx, cloneDump(an.Dump))
	if err != nil {
		return nil, nil, fmt.Errorf("replaying the anonymised snapshot: %w", err)
	}
	if back := an.Key.RestoreDecisions(got); !reflect.DeepEqual(want, back) {
		return nil, nil, fmt.Errorf("the anonymised snapshot replays differently (original %+v, anonymised mapped back %+v)", want, back)
	}
	return want, got, nil
}

// AnonymizeSnapshot anonymises a snapshot file (MarshalDump's bytes),
// checks that it replays to the same decisions (CheckAnonymized) and
// returns it with the key and the warnings, which also head the file as
// YAML comments.
func AnonymizeSnapshot(ctx context.Context, data []byte) ([]byte, *Anonymized, error) {
	d, err := ParseDump(data)
	if err != nil {
		return nil, nil, err
	}
	an, err := Anonymize(d)
	if err != nil {
		return nil, nil, fmt.Errorf("anonymising the snapshot: %w", err)
	}
	want, got, err := CheckAnonymized(ctx, d, an)
	if err != nil {
		return nil, nil, err
	}
	switch {
	case d.Decisions == nil:
	case reflect.DeepEqual(want, d.Decisions):
		// The controller's decisions are the replay's: renamed, they are
		// the anonymised replay's, exactly (reasons included, where a
		// word-by-word renaming would also rename a word like "gang" when a
		// PodGroup bears that name).
		an.Dump.Decisions = got
	default:
		an.Warnings = append(an.Warnings, "the original's replay differs from the controller's decisions: "+
			"the decisions' reasons were renamed word by word (a word that is also a name is renamed too)")
	}
	out, err := MarshalDump(an.Dump)
	if err != nil {
		return nil, nil, err
	}
	var head []byte
	for _, w := range an.Warnings {
		head = append(head, "# anonymize warning: "+strings.ReplaceAll(w, "\n", " ")+"\n"...)
	}
	return append(head, out...), an, nil
}
