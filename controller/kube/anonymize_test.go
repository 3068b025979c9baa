package kube

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/draname"
)

// adversarialNames sort in ways that trip a naive renaming: prefixes,
// '-' and '.' against '/', digits compared as text (pod-9 > pod-10), and
// names reused across kinds (a node, a namespace and a queue all "a").
var adversarialNames = []string{"a", "a-b", "a.b", "ab", "a0", "a-0", "b", "pod-9", "pod-10", "pod-1",
	"n", "n-1", "n.1", "n1", "n-10", "n-9", "team", "team-a", "team.a", "0a", "9", "z", "default",
	"gang", "queue", "node", "needs"} // words of the reasons too

// adversarialDump is a random cluster over adversarialNames: identical
// nodes and identical pods, so that which pod binds first and where is
// settled by the core's tie-breaks on names; some pods pinned by a user
// label or a CEL selector on a GPU's UUID, maybe a gang. Its decisions are
// the replay's, as the controller records its own.
func adversarialDump(t *testing.T, seed int64) *Dump {
	rng := rand.New(rand.NewSource(seed))
	pick := func(n int) []string {
		p := rng.Perm(len(adversarialNames))[:n]
		out := make([]string, n)
		for i, j := range p {
			out[i] = adversarialNames[j]
		}
		return out
	}
	d := replayDump()
	o := &d.Objects
	o.Nodes, o.ResourceSlices, o.Pods, o.ResourceClaims, o.Namespaces, o.Queues = nil, nil, nil, nil, nil, nil
	nodes, used := pick(2+rng.Intn(4)), map[string]int{}
	racks := pick(2)
	for _, n := range nodes {
		node, sl := replayNode(n)
		node.Labels["rack"] = racks[rng.Intn(2)]
		o.Nodes, o.ResourceSlices = append(o.Nodes, node), append(o.ResourceSlices, sl)
	}
	queues := pick(1 + rng.Intn(3))
	for _, q := range queues {
		o.Queues = append(o.Queues, queueObject(q, int64(rng.Intn(8)), int64(1+rng.Intn(2))))
	}
	nss := pick(1 + rng.Intn(3))
	for _, ns := range nss {
		o.Namespaces = append(o.Namespaces, v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"kubernetes.io/metadata.name": ns}}})
	}
	seen := map[string]bool{}
	for i := 0; i < 4+rng.Intn(10); i++ {
		ns, name := nss[rng.Intn(len(nss))], adversarialNames[rng.Intn(len(adversarialNames))]
		if seen[ns+"/"+name] {
			continue
		}
		seen[ns+"/"+name] = true
		gpus, node := int64(1+rng.Intn(3)), ""
		if n := nodes[rng.Intn(len(nodes))]; rng.Intn(2) == 0 && used[n]+int(gpus) <= 4 {
			node = n
		}
		p, c := replayPod(ns, name, queues[rng.Intn(len(queues))], gpus, node, used[node])
		if node != "" {
			used[node] += int(gpus)
		} else if k := rng.Intn(4); k == 0 {
			p.Spec.NodeSelector = map[string]string{"rack": racks[rng.Intn(2)]}
		} else if k == 1 {
			n := nodes[rng.Intn(len(nodes))]
			c.Spec.Devices.Requests[0].Exactly.Count = 1
			c.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf(`device.attributes["%s"].uuid == "GPU-%s-%d"`, DriverName, n, rng.Intn(4))}}}
		}
		o.Pods, o.ResourceClaims = append(o.Pods, p), append(o.ResourceClaims, c)
	}
	if rng.Intn(2) == 0 {
		addGang(rng, d, nss[0], pick(1)[0], queues[0])
	}
	for i := range o.Pods {
		sanitizePod(&o.Pods[i])
	}
	dec, err := Replay(context.Background(), cloneDump(d))
	require.NoError(t, err, "seed %d", seed)
	d.Decisions = dec
	return d
}

// addGang adds a PodGroup of minMember 2 with two pending one-GPU pods.
func addGang(rng *rand.Rand, d *Dump, ns, name, queue string) {
	o := &d.Objects
	o.PodGroups = append(o.PodGroups, map[string]any{"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "PodGroup",
		"metadata": map[string]any{"name": name, "namespace": ns}, "spec": map[string]any{"minMember": int64(2), "queue": queue}})
	for i := 0; i < 2; i++ {
		p, c := replayPod(ns, fmt.Sprintf("%s-%d", name, i+rng.Intn(2)*9), queue, 1, "", 0)
		if len(checkPodKey(o.Pods, p)) > 0 {
			continue
		}
		p.Annotations = map[string]string{AnnotationPodGroup: name}
		delete(p.Labels, LabelQueue)
		o.Pods, o.ResourceClaims = append(o.Pods, p), append(o.ResourceClaims, c)
	}
}

func checkPodKey(pods []v1.Pod, p v1.Pod) string {
	for _, q := range pods {
		if q.Namespace == p.Namespace && q.Name == p.Name {
			return q.Name
		}
	}
	return ""
}

// testDumps are the repository's cycle snapshots and 40 adversarial ones.
func testDumps(t *testing.T) map[string]*Dump {
	out := map[string]*Dump{"replayDump": replayDump()}
	files, err := filepath.Glob(filepath.Join("testdata", "replay", "*.yaml"))
	require.NoError(t, err)
	files = append(files, filepath.Join("..", "..", "cmd", "tessera-sim", "testdata", "*.yaml"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // the glob of tessera-sim's testdata when it holds none
		}
		d, err := ParseDump(data)
		require.NoError(t, err, f)
		out[f] = d
	}
	for seed := int64(1); seed <= 40; seed++ {
		out[fmt.Sprintf("seed %d", seed)] = adversarialDump(t, seed)
	}
	return out
}

// TestAnonymizeReplayEquivalent: the replay of an anonymised snapshot
// decides what the original's replay decides, once mapped back through the
// key — binds (pod, node, GPUs), evictions, why each pod waits and the fair
// shares — and the anonymised file's own decisions are its replay's.
func TestAnonymizeReplayEquivalent(t *testing.T) {
	ctx := context.Background()
	for name, d := range testDumps(t) {
		t.Run(name, func(t *testing.T) {
			want, err := Replay(ctx, cloneDump(d))
			require.NoError(t, err)
			an, err := Anonymize(d)
			require.NoError(t, err)
			got, err := Replay(ctx, cloneDump(an.Dump))
			require.NoError(t, err)
			require.Equal(t, want, an.Key.RestoreDecisions(got), "the anonymised replay, mapped back, differs")
			assert.Empty(t, an.Warnings)
			data, err := MarshalDump(d)
			require.NoError(t, err)
			file, an2, err := AnonymizeSnapshot(ctx, data)
			require.NoError(t, err)
			assert.Equal(t, an.Key.Segments, an2.Key.Segments, "the renaming is not deterministic")
			back, err := ParseDump(file)
			require.NoError(t, err, "the anonymised snapshot does not read back")
			if d.Decisions != nil {
				assert.Equal(t, got, back.Decisions, "the anonymised file's decisions are not its replay's")
			}
			checkRenamed(t, d, an)
		})
	}
}

// checkRenamed fails when an object keeps its name or the key is the
// identity anywhere but on the fixed segments.
func checkRenamed(t *testing.T, d *Dump, an *Anonymized) {
	t.Helper()
	orig := map[string]bool{}
	for _, n := range d.Objects.Nodes {
		orig[n.Name] = true
	}
	for _, p := range d.Objects.Pods {
		orig[p.Namespace+"/"+p.Name] = true
	}
	for _, n := range an.Dump.Objects.Nodes {
		assert.False(t, orig[n.Name] && n.Name != DefaultQueue, "node %s kept its name", n.Name)
	}
	for _, p := range an.Dump.Objects.Pods {
		assert.False(t, orig[p.Namespace+"/"+p.Name], "pod %s/%s kept its name", p.Namespace, p.Name)
	}
	for o, tok := range an.Key.Segments {
		if o != DefaultQueue && o != externalQueue {
			assert.NotEqual(t, o, tok)
		}
	}
}

// TestAnonymizeNeedsOrder: the equivalence check can fail. The same
// renaming with the tokens shuffled between segments (consistent, but not
// order-preserving) changes decisions on some of the adversarial dumps.
func TestAnonymizeNeedsOrder(t *testing.T) {
	ctx := context.Background()
	differ := 0
	for seed := int64(1); seed <= 40; seed++ {
		d := adversarialDump(t, seed)
		c := collectNames(d)
		key, err := newAnonymizeKey(c.segs)
		require.NoError(t, err)
		var origs, toks []string
		for o, tok := range key.Segments {
			if o != tok {
				origs, toks = append(origs, o), append(toks, tok)
			}
		}
		sort.Strings(origs)
		sort.Strings(toks)
		rng := rand.New(rand.NewSource(seed))
		rng.Shuffle(len(toks), func(i, j int) { toks[i], toks[j] = toks[j], toks[i] })
		shuffled := &AnonymizeKey{Version: AnonymizeKeyVersion, Segments: map[string]string{}}
		for i, o := range origs {
			shuffled.Segments[o] = toks[i]
		}
		require.Error(t, shuffled.check(), "a shuffled key must not pass the order check")
		want, err := Replay(ctx, cloneDump(d))
		require.NoError(t, err)
		got, err := Replay(ctx, anonymizeWith(d, c.names, shuffled).Dump)
		require.NoError(t, err)
		if !reflect.DeepEqual(want, shuffled.RestoreDecisions(got)) {
			differ++
		}
	}
	t.Logf("a shuffled (order-breaking) renaming changes the decisions of %d of 40 adversarial dumps", differ)
	assert.Positive(t, differ, "the adversarial dumps do not exercise name order")
}

func TestAnonymizeKeyOrder(t *testing.T) {
	segs := map[string]bool{}
	for _, n := range adversarialNames {
		for _, s := range segments(n) {
			segs[s] = true
		}
	}
	for _, s := range []string{"<", "<external", "<externalz", "defaul", "defaultz", "default0", "0", "00", "A", "_", "~~"} {
		segs[s] = true
	}
	k, err := newAnonymizeKey(segs)
	require.NoError(t, err)
	assert.Equal(t, DefaultQueue, k.Segments[DefaultQueue])
	// Composite keys keep their order too.
	var keys []string
	for _, a := range adversarialNames {
		for _, b := range adversarialNames {
			keys = append(keys, a+"/"+b, a+"-"+b, "<external>/"+a+"/"+b)
		}
	}
	sort.Strings(keys)
	for i := 1; i < len(keys); i++ {
		x, y := k.Anonymize(keys[i-1]), k.Anonymize(keys[i])
		require.True(t, x < y || keys[i-1] == keys[i], "%q < %q but %q >= %q", keys[i-1], keys[i], x, y)
		require.Equal(t, keys[i], k.Restore(y))
	}
	data, err := MarshalAnonymizeKey(k)
	require.NoError(t, err)
	back, err := ParseAnonymizeKey(data)
	require.NoError(t, err)
	assert.Equal(t, k.Segments, back.Segments)
}

func TestParseAnonymizeKeyErrors(t *testing.T) {
	for _, tc := range []struct{ name, data, want string }{
		{"version", "version: v0\nsegments: {}\n", "version"},
		{"unknown field", "version: " + AnonymizeKeyVersion + "\nsegments: {}\nextra: 1\n", "extra"},
		{"token twice", "version: " + AnonymizeKeyVersion + "\nsegments: {a: x1, b: x1}\n", "both map"},
		{"order", "version: " + AnonymizeKeyVersion + "\nsegments: {a: x2, b: x1}\n", "not in that order"},
		{"separator", "version: " + AnonymizeKeyVersion + "\nsegments: {a-b: x1}\n", "not one name segment"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseAnonymizeKey([]byte(tc.data))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestRewriteCELStrings(t *testing.T) {
	names := map[string]string{"GPU-n1-0": "x", "n1": "y"}
	rename := func(s string) (string, bool) { v, ok := names[s]; return v, ok }
	for _, tc := range []struct{ in, want, kept string }{
		{`device.attributes["gpu.tessera.dev"].uuid == "GPU-n1-0"`, `device.attributes["x"].uuid == "x"`, "gpu.tessera.dev"},
		{`a == 'n1' || b == r"n1" || c == """n1"""`, `a == 'y' || b == r"y" || c == """y"""`, ""},
		{`x == "n\x31" // "n1"` + "\n" + `|| y == 'n1'`, `x == "n\x31" // "n1"` + "\n" + `|| y == 'y'`, `n\x31`},
		{`r == "say \"n1\""`, `r == "say \"n1\""`, `say \"n1\"`},
	} {
		got, kept, err := rewriteCELStrings(tc.in, rename)
		require.NoError(t, err, tc.in)
		if tc.want == `device.attributes["x"].uuid == "x"` {
			tc.want = `device.attributes["gpu.tessera.dev"].uuid == "x"`
		}
		assert.Equal(t, tc.want, got)
		if tc.kept != "" {
			assert.Contains(t, kept, tc.kept)
		}
	}
	for _, bad := range []string{`a == "n1`, "a == 'n\n1'", `a == """n1""`} {
		got, _, err := rewriteCELStrings(bad, rename)
		assert.Error(t, err, bad)
		assert.Equal(t, bad, got)
	}
}

// TestAnonymizeCELWarning: a literal that holds a renamed name but is not
// one is kept, and the output says so.
func TestAnonymizeCELWarning(t *testing.T) {
	d := replayDump()
	c := &d.Objects.ResourceClaims[0]
	c.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
		Expression: `device.attributes["` + DriverName + `"].uuid.startsWith("GPU-n1")`}}}
	an, err := Anonymize(d)
	require.NoError(t, err)
	require.Len(t, an.Warnings, 1)
	assert.Contains(t, an.Warnings[0], `"GPU-n1"`)
	assert.NotContains(t, an.Warnings[0], "run-a", "the warning names the claim by its new name")
	_ = draname.AttrUUID
	assert.True(t, strings.Contains(an.Dump.Objects.ResourceClaims[0].Spec.Devices.Requests[0].Exactly.Selectors[0].CEL.Expression, `"GPU-n1"`))
}
