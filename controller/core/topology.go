package core

import "strings"

// Topology-aware gangs (Job.Topology, SubGroup.Topology): a gang with a
// required level is placed inside one domain of that level or not at all;
// a preferred level is tried domain by domain before the gang may spread.
// Jobs without a constraint take the paths they took before.

// topoState is one valid topology of the snapshot.
type topoState struct {
	name   string
	levels []string
}

// level is the position of a label key among the topology's levels
// (0 the broadest), -1 when it is not one.
func (t *topoState) level(key string) int {
	for i, l := range t.levels {
		if l == key {
			return i
		}
	}
	return -1
}

// levelName is the short name of a level in people's words: the last path
// segment of its label key ("topology.kubernetes.io/zone" → "zone",
// "kubernetes.io/hostname" → "hostname", "nvidia.com/gpu.clique" →
// "gpu.clique").
func levelName(key string) string {
	return key[strings.LastIndexByte(key, '/')+1:]
}
