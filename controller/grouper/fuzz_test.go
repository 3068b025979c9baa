package grouper

import (
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// FuzzDerive feeds arbitrary JSON specs to every kind's derivation (seeds:
// the realistic manifests of derive_test.go): never a panic; a decision is
// a gang of 1 to maxMembers pods whose subgroups fit in it, or alone; an
// error names a field or label.
func FuzzDerive(f *testing.F) {
	var gks []schema.GroupKind
	for gk, info := range kinds {
		if info.derive != nil {
			gks = append(gks, gk)
		}
	}
	sort.Slice(gks, func(i, j int) bool { return gks[i].String() < gks[j].String() })
	names := make([]string, 0, len(manifests))
	for n := range manifests {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		obj, _ := load(f, manifests[n])
		b, _ := json.Marshal(obj)
		for i := range gks {
			f.Add(uint8(i), b, "2", "1")
		}
	}
	f.Fuzz(func(t *testing.T, kind uint8, raw []byte, idx, worker string) {
		var obj map[string]any
		if json.Unmarshal(raw, &obj) != nil || obj == nil {
			return
		}
		gk := gks[int(kind)%len(gks)]
		labels := map[string]string{labelLWSGroupIndex: idx, labelLWSWorkerIndex: worker, labelJobSetReplicatedJob: worker,
			labelJobSetJobIndex: idx, labelRayGroup: worker, labelRayNodeType: idx}
		d, err := kinds[gk].derive(obj, labels)
		if err != nil {
			msg := err.Error()
			if !strings.Contains(msg, "spec") && !strings.Contains(msg, "label") {
				t.Fatalf("%v: error names no field: %v", gk, err)
			}
			return
		}
		if d.alone {
			return
		}
		if d.min < 1 || d.min > maxMembers {
			t.Fatalf("%v: min %d out of range", gk, d.min)
		}
		var subs int64
		for _, s := range d.subGroups {
			if s.MinMember < 1 || s.Name == "" {
				t.Fatalf("%v: subgroup %+v", gk, s)
			}
			subs += int64(s.MinMember)
		}
		if subs > d.min {
			t.Fatalf("%v: subgroups %v need %d, more than the gang's %d", gk, d.subGroups, subs, d.min)
		}
	})
}
