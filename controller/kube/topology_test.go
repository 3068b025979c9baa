package kube

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/core"
)

func TestTopologyFromAnnotations(t *testing.T) {
	for _, c := range []struct {
		name string
		ann  map[string]string
		want *schedv1.TopologyConstraint
		err  string
	}{
		{name: "none", ann: map[string]string{"other": "x"}},
		{name: "required and preferred",
			ann:  map[string]string{AnnotationTopology: "dc", AnnotationTopologyRequired: "example.com/block", AnnotationTopologyPreferred: " example.com/rack "},
			want: &schedv1.TopologyConstraint{Name: "dc", Required: "example.com/block", Preferred: "example.com/rack"}},
		{name: "preferred only", ann: map[string]string{AnnotationTopology: "dc", AnnotationTopologyPreferred: "nvidia.com/gpu.clique"},
			want: &schedv1.TopologyConstraint{Name: "dc", Preferred: "nvidia.com/gpu.clique"}},
		{name: "level without topology", ann: map[string]string{AnnotationTopologyRequired: "rack"},
			err: "annotation tessera.dev/topology must name a Topology when tessera.dev/topology-required or tessera.dev/topology-preferred is set"},
		{name: "topology without level", ann: map[string]string{AnnotationTopology: "dc"},
			err: `annotation tessera.dev/topology: "dc" needs a level in tessera.dev/topology-required or tessera.dev/topology-preferred`},
		{name: "bad topology name", ann: map[string]string{AnnotationTopology: "DC!", AnnotationTopologyRequired: "rack"},
			err: `annotation tessera.dev/topology: "DC!" is not a Topology name`},
		{name: "bad level", ann: map[string]string{AnnotationTopology: "dc", AnnotationTopologyRequired: "a rack"},
			err: `annotation tessera.dev/topology-required: "a rack" is not a node label key`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := TopologyFromAnnotations(c.ann)
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				require.Nil(t, got)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
}

// FuzzTopologyFromAnnotations: an accepted constraint names a topology
// and a level, each as given (trimmed); an error names an annotation.
func FuzzTopologyFromAnnotations(f *testing.F) {
	f.Add("dc", "example.com/rack", "", true)
	f.Add("dc", "topology.kubernetes.io/zone", "kubernetes.io/hostname", true)
	f.Add("", "rack", "", true)
	f.Add("dc", "", "", false)
	f.Add("x", "a/b/c", "-", true)
	f.Fuzz(func(t *testing.T, name, req, pref string, all bool) {
		ann := map[string]string{AnnotationTopology: name}
		if all || req != "" {
			ann[AnnotationTopologyRequired] = req
		}
		if all || pref != "" {
			ann[AnnotationTopologyPreferred] = pref
		}
		got, err := TopologyFromAnnotations(ann)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "annotation tessera.dev/topology") {
				t.Fatalf("error %q names no annotation", err)
			}
			return
		}
		switch {
		case got == nil:
			t.Fatalf("nil constraint from %v", ann)
		case got.Name != strings.TrimSpace(name) || got.Name == "":
			t.Fatalf("name %q from %q", got.Name, name)
		case got.Required != strings.TrimSpace(req) || got.Preferred != strings.TrimSpace(pref):
			t.Fatalf("levels %q, %q from %q, %q", got.Required, got.Preferred, req, pref)
		case got.Required == "" && got.Preferred == "":
			t.Fatalf("no level accepted from %v", ann)
		}
	})
}

func TestUpstreamTopology(t *testing.T) {
	b := &snapshotBuild{snap: &core.Snapshot{Topologies: []core.Topology{
		{Name: "a-net", Levels: []string{"example.com/zone", "example.com/rack"}},
		{Name: "b-net", Levels: []string{"example.com/rack", "kubernetes.io/hostname"}},
	}}}
	// The first Topology (by name) listing the key.
	require.Equal(t, &core.TopologyConstraint{Topology: "a-net", Required: "example.com/rack"}, b.upstreamTopology("example.com/rack"))
	require.Equal(t, &core.TopologyConstraint{Topology: "b-net", Required: "kubernetes.io/hostname"}, b.upstreamTopology("kubernetes.io/hostname"))
	// A key no Topology lists: a one-level topology of its own, added once.
	want := &core.TopologyConstraint{Topology: "scheduling.k8s.io:example.com/block", Required: "example.com/block"}
	require.Equal(t, want, b.upstreamTopology("example.com/block"))
	require.Equal(t, want, b.upstreamTopology("example.com/block"))
	require.Len(t, b.snap.Topologies, 3)
	require.Equal(t, []string{"example.com/block"}, b.snap.Topologies[2].Levels)
	require.NoError(t, core.ValidateTopologyConstraint(*want, b.snap.Topologies))
	// kubectl tessera why lists Topologies in any order: still the first by
	// name, and the one-level topology when none lists the key.
	listed := []core.Topology{b.snap.Topologies[1], b.snap.Topologies[0]}
	require.Equal(t, "a-net", UpstreamTopology(listed, "example.com/rack").Name)
	require.Equal(t, core.Topology{Name: "scheduling.k8s.io:example.com/row", Levels: []string{"example.com/row"}}, UpstreamTopology(listed, "example.com/row"))
}
