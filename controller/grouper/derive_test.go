package grouper

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/controller/kube"
)

// manifests are realistic objects of each kind, as their users write them
// (trimmed of what the grouper does not read), keyed by test name.
var manifests = map[string]string{
	"indexed job": `
apiVersion: batch/v1
kind: Job
metadata: {name: llama, namespace: team-a}
spec:
  completionMode: Indexed
  completions: 4
  parallelism: 4
  template: {spec: {containers: [{name: w, image: trainer}]}}`,
	"indexed job partly done": `
apiVersion: batch/v1
kind: Job
metadata: {name: llama}
spec: {completionMode: Indexed, completions: 4, parallelism: 4}
status: {succeeded: 1, active: 3}`,
	"indexed job fewer at once": `
apiVersion: batch/v1
kind: Job
metadata: {name: sweep}
spec: {completionMode: Indexed, completions: 100, parallelism: 10}`,
	"non-indexed job": `
apiVersion: batch/v1
kind: Job
metadata: {name: etl}
spec: {completions: 4, parallelism: 4}`,
	"pytorchjob": `
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: bert}
spec:
  pytorchReplicaSpecs:
    Master: {replicas: 1, restartPolicy: OnFailure, template: {spec: {containers: [{name: pytorch}]}}}
    Worker: {replicas: 3, restartPolicy: OnFailure, template: {spec: {containers: [{name: pytorch}]}}}`,
	"pytorchjob elastic": `
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: elastic}
spec:
  elasticPolicy: {minReplicas: 2, maxReplicas: 8, rdzvBackend: c10d}
  pytorchReplicaSpecs:
    Worker: {replicas: 4}`,
	"pytorchjob minAvailable": `
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: ma}
spec:
  runPolicy: {schedulingPolicy: {minAvailable: 3, queue: team-a}}
  pytorchReplicaSpecs:
    Master: {replicas: 1}
    Worker: {replicas: 7}`,
	"tfjob": `
apiVersion: kubeflow.org/v1
kind: TFJob
metadata: {name: tf}
spec:
  tfReplicaSpecs:
    PS: {replicas: 2}
    Worker: {replicas: 4}
    Chief: {}`,
	"xgboostjob": `
apiVersion: kubeflow.org/v1
kind: XGBoostJob
metadata: {name: xgb}
spec:
  xgbReplicaSpecs:
    Master: {replicas: 1}
    Worker: {replicas: 2}`,
	"mpijob": `
apiVersion: kubeflow.org/v2beta1
kind: MPIJob
metadata: {name: hvd}
spec:
  slotsPerWorker: 1
  mpiReplicaSpecs:
    Launcher: {replicas: 1}
    Worker: {replicas: 4}`,
	"jobset": `
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: js}
spec:
  replicatedJobs:
  - name: driver
    replicas: 1
    template: {spec: {parallelism: 1, completions: 1}}
  - name: workers
    replicas: 2
    template: {spec: {parallelism: 4, completions: 4}}`,
	"lws": `
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {name: vllm}
spec:
  replicas: 3
  leaderWorkerTemplate:
    size: 4
    workerTemplate: {spec: {containers: [{name: vllm}]}}`,
	"raycluster": `
apiVersion: ray.io/v1
kind: RayCluster
metadata: {name: rc}
spec:
  headGroupSpec: {rayStartParams: {}}
  workerGroupSpecs:
  - {groupName: small, replicas: 4, minReplicas: 2, maxReplicas: 8}
  - {groupName: tpu, replicas: 2, minReplicas: 2, numOfHosts: 4}
  - {groupName: spare, replicas: 1}`,
	"statefulset": `
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec: {replicas: 3}`,
}

func TestDerive(t *testing.T) {
	tests := []struct {
		manifest string
		labels   map[string]string
		alone    bool
		min      int64
		suffix   string
		subs     []SubGroup
		sub      string
	}{
		{manifest: "indexed job", min: 4},
		{manifest: "indexed job partly done", min: 3},
		{manifest: "indexed job fewer at once", alone: true},
		{manifest: "non-indexed job", alone: true},
		{manifest: "pytorchjob", min: 4},
		{manifest: "pytorchjob elastic", min: 2},
		{manifest: "pytorchjob minAvailable", min: 3},
		{manifest: "tfjob", min: 7},
		{manifest: "xgboostjob", min: 3},
		{manifest: "mpijob", min: 5},
		{manifest: "jobset", min: 9, labels: map[string]string{labelJobSetReplicatedJob: "workers", labelJobSetJobIndex: "1"},
			subs: []SubGroup{{"driver-0", 1}, {"workers-0", 4}, {"workers-1", 4}}, sub: "workers-1"},
		{manifest: "lws", min: 4, suffix: "2", labels: map[string]string{labelLWSGroupIndex: "2", labelLWSWorkerIndex: "3"},
			subs: []SubGroup{{"leader", 1}, {"workers", 3}}, sub: "workers"},
		{manifest: "lws", min: 4, suffix: "0", labels: map[string]string{labelLWSGroupIndex: "0", labelLWSWorkerIndex: "0"},
			subs: []SubGroup{{"leader", 1}, {"workers", 3}}, sub: "leader"},
		{manifest: "raycluster", min: 11, labels: map[string]string{labelRayNodeType: "worker", labelRayGroup: "tpu"},
			subs: []SubGroup{{"head", 1}, {"small", 2}, {"tpu", 8}}, sub: "tpu"},
		{manifest: "raycluster", min: 11, labels: map[string]string{labelRayNodeType: "head"},
			subs: []SubGroup{{"head", 1}, {"small", 2}, {"tpu", 8}}, sub: "head"},
		{manifest: "statefulset", alone: true},
	}
	for _, tc := range tests {
		t.Run(tc.manifest+" "+tc.sub, func(t *testing.T) {
			obj, info := load(t, manifests[tc.manifest])
			d, err := info.derive(obj, tc.labels)
			if err != nil {
				t.Fatalf("derive: %v", err)
			}
			if d.alone != tc.alone || d.min != tc.min || d.suffix != tc.suffix || d.subGroup != tc.sub {
				t.Fatalf("got alone=%v min=%d suffix=%q sub=%q; want alone=%v min=%d suffix=%q sub=%q",
					d.alone, d.min, d.suffix, d.subGroup, tc.alone, tc.min, tc.suffix, tc.sub)
			}
			if len(tc.subs) > 0 || len(d.subGroups) > 0 {
				if len(d.subGroups) != len(tc.subs) {
					t.Fatalf("subgroups %v, want %v", d.subGroups, tc.subs)
				}
				for i := range tc.subs {
					if d.subGroups[i] != tc.subs[i] {
						t.Fatalf("subgroups %v, want %v", d.subGroups, tc.subs)
					}
				}
			}
		})
	}
}

// TestDeriveErrors: what cannot be read is an error naming the field.
func TestDeriveErrors(t *testing.T) {
	tests := []struct{ manifest, want string }{
		{"apiVersion: batch/v1\nkind: Job\nspec: {completionMode: Indexed, parallelism: -1, completions: 4}", "spec.parallelism: -1 is not between 0"},
		{"apiVersion: batch/v1\nkind: Job\nspec: {completionMode: Indexed, parallelism: four}", "spec.parallelism: four is not a number"},
		{"apiVersion: batch/v1\nkind: Job\nspec: {completionMode: Indexed, parallelism: 2.5}", "spec.parallelism: 2.5 is not a whole number"},
		{"apiVersion: batch/v1\nkind: Job\nspec: [1]", "spec is not an object"},
		{"apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nspec: {}", "spec.pytorchReplicaSpecs: no replica types"},
		{"apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nspec: {pytorchReplicaSpecs: {Worker: {replicas: 1e30}}}", "spec.pytorchReplicaSpecs.Worker: replicas: 1e+30 is not a whole number"},
		{"apiVersion: kubeflow.org/v1\nkind: TFJob\nspec: {tfReplicaSpecs: {Worker: {replicas: 0}}}", "spec.tfReplicaSpecs: 0 replicas in all"},
		{"apiVersion: kubeflow.org/v1\nkind: TFJob\nspec: {tfReplicaSpecs: {A: {replicas: 1000000}, B: {replicas: 1000000}}}", "spec.tfReplicaSpecs: more than 1048576 pods"},
		{"apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nspec: {replicatedJobs: []}", "spec.replicatedJobs: none"},
		{"apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nspec: {replicatedJobs: [{name: w, replicas: 1000000, template: {spec: {parallelism: 1000}}}]}", "spec.replicatedJobs[0]: 1000000 Jobs × 1000 pods"},
		{"apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nspec: {replicatedJobs: [{replicas: 1}]}", "spec.replicatedJobs[0]: name is empty"},
		{"apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nspec: {leaderWorkerTemplate: {size: 0}}", "spec.leaderWorkerTemplate.size: 0 is below 1"},
		{"apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nspec: {leaderWorkerTemplate: {size: 2}}", `pod label leaderworkerset.sigs.k8s.io/group-index: "" is not a group index`},
		{"apiVersion: ray.io/v1\nkind: RayCluster\nspec: {workerGroupSpecs: {a: 1}}", "spec.workerGroupSpecs is not a list"},
		{"apiVersion: ray.io/v1\nkind: RayCluster\nspec: {workerGroupSpecs: [{groupName: g, minReplicas: 2000, numOfHosts: 2000}]}", "spec.workerGroupSpecs[0]: 2000 replicas × 2000 hosts"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			obj, info := load(t, tc.manifest)
			_, err := info.derive(obj, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// TestGroupedKindsAreKnown: every controller kind the scheduler holds pods
// of for the grouper is one the grouper walks, or its pods would wait for
// good.
func TestGroupedKindsAreKnown(t *testing.T) {
	for gk := range kube.GroupedKinds {
		if _, ok := kinds[gk]; !ok {
			t.Errorf("kube.GroupedKinds has %v, which the grouper does not know", gk)
		}
	}
}

func TestGroupName(t *testing.T) {
	if got := groupName("job", "llama", ""); got != "job-llama" {
		t.Fatalf("got %q", got)
	}
	if got := groupName("lws", "vllm", "3"); got != "lws-vllm-3" {
		t.Fatalf("got %q", got)
	}
	long := groupName("job", strings.Repeat("a", 260), "")
	if len(long) > 253 || long == groupName("job", strings.Repeat("a", 261), "") {
		t.Fatalf("long names: %q (%d)", long, len(long))
	}
}

func load(t testing.TB, manifest string) (map[string]any, kindInfo) {
	t.Helper()
	var obj map[string]any
	if err := yaml.Unmarshal([]byte(manifest), &obj); err != nil {
		t.Fatalf("manifest: %v", err)
	}
	av, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	gv, err := schema.ParseGroupVersion(av)
	if err != nil {
		t.Fatal(err)
	}
	info, ok := kinds[schema.GroupKind{Group: gv.Group, Kind: kind}]
	if !ok || info.derive == nil {
		t.Fatalf("no derivation for %s %s", av, kind)
	}
	return obj, info
}

// TestValidSubGroups: subgroups the CRD would refuse (a name that is no DNS
// label, more than 64) are all dropped, and so is the pod's subgroup.
func TestValidSubGroups(t *testing.T) {
	many := make([]SubGroup, maxSubGroups+1)
	for i := range many {
		many[i] = SubGroup{Name: "w-" + strings.Repeat("x", i%5+1), MinMember: 1}
	}
	tests := []struct {
		name     string
		subs     []SubGroup
		sub      string
		wantSubs int
		wantSub  string
	}{
		{"valid", []SubGroup{{"head", 1}, {"workers", 3}}, "workers", 2, "workers"},
		{"pod names one not in the list", []SubGroup{{"head", 1}}, "gpu", 1, ""},
		{"uppercase name", []SubGroup{{"head", 1}, {"GPU-Workers", 3}}, "head", 0, ""},
		{"too long", []SubGroup{{strings.Repeat("a", 60) + "-1000", 1}}, "", 0, ""},
		{"too many", many, "w-x", 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			subs, sub := validSubGroups(tc.subs, tc.sub)
			if len(subs) != tc.wantSubs || sub != tc.wantSub {
				t.Fatalf("got %d subgroups, %q; want %d, %q", len(subs), sub, tc.wantSubs, tc.wantSub)
			}
		})
	}
}
