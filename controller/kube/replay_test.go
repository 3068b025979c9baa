package kube

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	gpuconfig "github.com/tessera-gpu/tessera/api/config/v1alpha1"
	"github.com/tessera-gpu/tessera/internal/draname"
)

var updateTestdata = flag.Bool("update", false, "rewrite testdata/replay/cluster.yaml")

// replayNode is a node of four 80 GiB GPUs and its slice.
func replayNode(name string) (v1.Node, resourceapi.ResourceSlice) {
	n := v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Labels: map[string]string{"kubernetes.io/hostname": name}},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{v1.ResourceCPU: resource.MustParse("32"), v1.ResourceMemory: resource.MustParse("256Gi"), v1.ResourcePods: resource.MustParse("110")},
			Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}}}
	sl := resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-gpus"}, Spec: resourceapi.ResourceSliceSpec{Driver: DriverName, NodeName: ptr.To(name),
		Pool: resourceapi.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: 1}}}
	for i := int64(0); i < 4; i++ {
		d := device(i, "d-"+name, false)
		d.Attributes[draname.AttrUUID] = resourceapi.DeviceAttribute{StringValue: ptr.To(fmt.Sprintf("GPU-%s-%d", name, i))}
		sl.Spec.Devices = append(sl.Spec.Devices, d)
	}
	return n, sl
}

// replayPod is a pod of ours in queue with a claim of gpus whole GPUs,
// bound to node when node is set (its claim allocated there, from GPU first).
func replayPod(ns, name, queue string, gpus int64, node string, first int) (v1.Pod, resourceapi.ResourceClaim) {
	p := v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + ns + "-" + name), ResourceVersion: "1",
		Labels: map[string]string{LabelQueue: queue}, CreationTimestamp: metav1.NewTime(time.Date(2026, 11, 28, 1, 0, 0, 0, time.UTC))},
		Spec: v1.PodSpec{SchedulerName: SchedulerName, NodeName: node,
			Containers: []v1.Container{{Name: "main", Image: "train:1", Command: []string{"run"}, Args: []string{"--token=s3cret"},
				Env:       []v1.EnvVar{{Name: "TOKEN", Value: "s3cret"}},
				Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}, Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("1")}}}},
			ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name + "-gpu")}}}}
	c := resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-gpu", UID: types.UID("uid-claim-" + ns + "-" + name), ResourceVersion: "1"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: gpus}}}}}}
	if node != "" {
		p.Status.Phase = v1.PodRunning
		a := &resourceapi.AllocationResult{}
		for i := 0; i < int(gpus); i++ {
			a.Devices.Results = append(a.Devices.Results, resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: DriverName, Pool: node, Device: draname.DeviceName(first + i)})
		}
		c.Status.Allocation = a
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name, UID: p.UID}}
	}
	return p, c
}

func queueObject(name string, gpuQuota, weight int64) map[string]any {
	return map[string]any{"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Queue", "metadata": map[string]any{"name": name},
		"spec": map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": fmt.Sprint(gpuQuota), "overQuotaWeight": weight}}}}
}

// replayDump is a small cluster: two nodes of four GPUs; team-a runs 2+2
// GPUs on n1 over its quota of 1 (no share over quota), team-b (quota 6) has 3 GPUs on n2 and wants 2
// more (a reclaim), a 1-GPU pod waits on a CEL selector no GPU matches, and
// a 16-GPU pod fits nowhere.
func replayDump() *Dump {
	d := &Dump{Version: DumpVersion, Now: time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC), Config: DumpConfig{GPUResource: "nvidia.com/gpu"}}
	o := &d.Objects
	for _, name := range []string{"n1", "n2"} {
		n, sl := replayNode(name)
		o.Nodes, o.ResourceSlices = append(o.Nodes, n), append(o.ResourceSlices, sl)
	}
	o.DeviceClasses = []resourceapi.DeviceClass{*class("gpu.tessera.dev", gpuconfig.Exclusive)}
	o.Queues = []map[string]any{queueObject("team-a", 1, 0), queueObject("team-b", 6, 1)}
	add := func(p v1.Pod, c resourceapi.ResourceClaim) {
		o.Pods, o.ResourceClaims = append(o.Pods, p), append(o.ResourceClaims, c)
	}
	add(replayPod("a", "run-a", "team-a", 2, "n1", 0))
	add(replayPod("a", "run-a2", "team-a", 2, "n1", 2))
	add(replayPod("b", "run-b", "team-b", 3, "n2", 0))
	add(replayPod("b", "want-b", "team-b", 2, "", 0))
	p, c := replayPod("a", "picky", "team-a", 1, "", 0)
	c.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
		Expression: `device.attributes["` + DriverName + `"].productName == "NVIDIA B200"`}}}
	add(p, c)
	add(replayPod("a", "huge", "team-a", 16, "", 0))
	for i := range o.Pods {
		sanitizePod(&o.Pods[i]) // as captureDump does
	}
	for _, ns := range []string{"a", "b"} {
		o.Namespaces = append(o.Namespaces, v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	return d
}

func TestReplay(t *testing.T) {
	d := replayDump()
	got, err := Replay(context.Background(), d)
	require.NoError(t, err)
	binds := map[string]string{}
	for _, b := range got.Binds {
		binds[b.Pod] = b.Node
	}
	assert.Equal(t, map[string]string{"b/want-b": "n1"}, binds, "team-b reclaims on n1")
	require.Len(t, got.Evictions, 1)
	assert.Equal(t, "a/run-a2", got.Evictions[0].Pod)
	assert.Equal(t, "reclaim", string(got.Evictions[0].Action))
	reasons := map[string]string{}
	for _, p := range got.Pending {
		reasons[p.Pod] = p.Reason
	}
	assert.Contains(t, reasons, "a/huge")
	assert.Contains(t, reasons, "a/picky")
	assert.Less(t, got.FairShare["team-a"].GPUMilli, int64(4000), "team-a runs over its fair share")
	assert.GreaterOrEqual(t, got.FairShare["team-b"].GPUMilli, int64(5000), "team-b's 5 GPUs are within its share")

	// The same decisions from the file as from the objects.
	b, err := MarshalDump(d)
	require.NoError(t, err)
	back, err := ParseDump(b)
	require.NoError(t, err)
	again, err := Replay(context.Background(), back)
	require.NoError(t, err)
	assert.Equal(t, got, again)

	path := filepath.Join("testdata", "replay", "cluster.yaml")
	if *updateTestdata {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, b, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "go test -run TestReplay ./controller/kube -update writes it")
	assert.Equal(t, string(want), string(b), "testdata/replay/cluster.yaml is stale: rerun with -update")
}

func TestSanitizePod(t *testing.T) {
	p, _ := replayPod("a", "p", "q", 1, "", 0)
	p.Annotations = map[string]string{v1.LastAppliedConfigAnnotation: `{"env":"s3cret"}`, "keep": "me"}
	p.Spec.ImagePullSecrets = []v1.LocalObjectReference{{Name: "s3cret-pull"}}
	p.Spec.Volumes = []v1.Volume{{Name: "s", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "s3cret-vol"}}},
		{Name: "c", VolumeSource: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: "csi.example.com", VolumeAttributes: map[string]string{"k": "s3cret"}, NodePublishSecretRef: &v1.LocalObjectReference{Name: "s3cret-ref"}}}}}
	p.Spec.InitContainers = []v1.Container{{Name: "init", Env: []v1.EnvVar{{Name: "X", Value: "s3cret"}}}}
	sanitizePod(&p)
	d := &Dump{Version: DumpVersion, Now: time.Now(), Objects: DumpObjects{Pods: []v1.Pod{p}}}
	b, err := MarshalDump(d)
	require.NoError(t, err)
	assert.NotContains(t, string(b), "s3cret")
	assert.Contains(t, string(b), "csi.example.com", "the CSI driver is counted against attach limits")
	assert.Equal(t, "me", p.Annotations["keep"])
}

func TestParseDumpErrors(t *testing.T) {
	good, err := MarshalDump(replayDump())
	require.NoError(t, err)
	cases := map[string]struct{ in, want string }{
		"other version": {strings.Replace(string(good), DumpVersion, "tessera.dev/cycle-snapshot/v9", 1), "version"},
		"unknown field": {string(good) + "extra: 1\n", "extra"},
		"no clock":      {"version: " + DumpVersion + "\n", "now is missing"},
		"two nodes":     {"version: " + DumpVersion + "\nnow: 2026-11-28T00:00:00Z\nobjects:\n  nodes:\n  - metadata: {name: node-1}\n  - metadata: {name: node-1}\n", "node node-1 appears twice"},
		"nameless pod":  {"version: " + DumpVersion + "\nnow: 2026-11-28T00:00:00Z\nobjects:\n  pods:\n  - metadata: {namespace: a}\n", "pod #0 has no name"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ParseDump([]byte(c.in))
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

// FuzzParseDump: a file either reads or fails with an error; one that reads
// replays without panicking, and writes back to a file that reads the same.
func FuzzParseDump(f *testing.F) {
	good, err := MarshalDump(replayDump())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte("version: " + DumpVersion + "\nnow: 2026-11-28T00:00:00Z\n"))
	f.Add([]byte("version: " + DumpVersion + "\nnow: 2026-11-28T00:00:00Z\nobjects:\n  queues:\n  - {metadata: {name: q}, spec: {resources: {gpu: {quota: x}}}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := ParseDump(data)
		if err != nil {
			if !strings.Contains(err.Error(), "cycle snapshot") {
				t.Fatalf("error does not say what it read: %v", err)
			}
			return
		}
		if _, err := Replay(context.Background(), d); err != nil {
			return // a bad object may fail the replay, with an error
		}
		b, err := MarshalDump(d)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseDump(b); err != nil {
			t.Fatalf("a dump written back does not read: %v", err)
		}
	})
}
