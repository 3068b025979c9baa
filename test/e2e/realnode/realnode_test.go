package realnode_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/driver/deviceclasses"
	"github.com/tessera-gpu/tessera/test/realnode"
)

// TestWholeGPU: a pod with a plain claim of the exclusive class runs and
// its container sees the UUID of the GPU the scheduler allocated, from the
// CDI spec, and no device nodes (fake mode); deleting the pod removes the
// spec.
func TestWholeGPU(t *testing.T) { setup(t).each(t, testWholeGPU) }

func testWholeGPU(t *testing.T, c *cluster) {
	rc := c.claim(t, "whole", deviceclasses.Exclusive, 3, "")
	c.create(t, c.gpuPod(t, "whole", "whole"))
	start := time.Now()
	c.waitRunning(t, "whole")
	t.Logf("whole-GPU pod Running %s after creation", time.Since(start).Round(10*time.Millisecond))

	_, uuid := c.allocatedUUID(t, "whole")
	env := c.printedEnv(t, "whole")
	if err := checkEnv(env, map[string]string{
		"NVIDIA_VISIBLE_DEVICES": uuid,
		"TESSERA_GPU_UUIDS":      uuid,
		"TESSERA_SHARING":        "Exclusive",
		"TESSERA_CLAIM":          c.ns + "/whole",
		"nvidia-devices":         "0",
	}); err != nil {
		t.Errorf("container env: %v", err)
	}
	if _, ok := env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]; ok {
		t.Errorf("exclusive container got MPS env: %v", env)
	}
	c.checkBinds(t, 1)
	spec := c.specPath(rc)
	if _, err := os.Stat(spec); err != nil {
		t.Fatalf("CDI spec of the running pod's claim: %v", err)
	}
	c.deletePod(t, "whole")
	waitGone(t, spec, 30*time.Second)
}

// TestSharing: two 40 GB MPS claims on one 80 GB GPU run side by side with
// their own limits and one MPS daemon; a time-sliced pair runs on another
// GPU, where an MPS claim is then refused (by tessera-node with an event
// under kube-scheduler, by tessera-scheduler itself before any node is
// involved); deleting the pods unprepares everything and tells the daemon
// to quit.
func TestSharing(t *testing.T) { setup(t).each(t, testSharing) }

func testSharing(t *testing.T, c *cluster) {
	mps := []string{"mps-a", "mps-b"}
	ts := []string{"ts-a", "ts-b"}
	var specs []string
	for _, name := range mps {
		specs = append(specs, c.specPath(c.claim(t, name, deviceclasses.MPS, 0, "40Gi")))
		c.create(t, c.gpuPod(t, name, name))
	}
	for _, name := range ts {
		specs = append(specs, c.specPath(c.claim(t, name, deviceclasses.TimeSlicing, 1, "20Gi")))
		c.create(t, c.gpuPod(t, name, name))
	}
	for _, name := range append(mps, ts...) {
		c.waitRunning(t, name)
	}

	_, gpu0 := c.allocatedUUID(t, "mps-a")
	for _, name := range mps {
		if err := checkEnv(c.printedEnv(t, name), map[string]string{
			"TESSERA_GPU_UUIDS":                 gpu0,
			"TESSERA_SHARING":                   "MPS",
			"TESSERA_CLAIM":                     c.ns + "/" + name,
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  gpu0 + "=40960M",
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
			"nvidia-devices":                    "0",
		}); err != nil {
			t.Errorf("pod %s: %v", name, err)
		}
	}
	_, gpu1 := c.allocatedUUID(t, "ts-a")
	for _, name := range ts {
		env := c.printedEnv(t, name)
		if err := checkEnv(env, map[string]string{
			"TESSERA_GPU_UUIDS":        gpu1,
			"TESSERA_SHARING":          "TimeSlicing",
			"TESSERA_GPU_MEMORY_BYTES": "21474836480",
		}); err != nil {
			t.Errorf("pod %s: %v", name, err)
		}
		if _, ok := env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]; ok {
			t.Errorf("time-sliced pod %s got MPS env", name)
		}
	}
	if got := starts(c.mpsRecords(t)); got != 1 {
		t.Errorf("MPS stand-in started %d times, want once for GPU 0; record %v", got, c.mpsRecords(t))
	}
	c.checkBinds(t, len(mps)+len(ts))

	// GPU 1 is time-sliced: an MPS claim on it.
	mixed := c.claim(t, "mixed", deviceclasses.MPS, 1, "20Gi")
	c.create(t, c.gpuPod(t, "mixed", "mixed"))
	if c.tessera() {
		c.refused(t, "mixed", "mixing sharing modes")
		if _, err := os.Stat(c.specPath(mixed)); err == nil {
			t.Errorf("the refused claim was prepared: %s exists", c.specPath(mixed))
		}
	} else {
		// kube-scheduler knows no sharing modes: it allocates the claim,
		// and tessera-node refuses to prepare it.
		deadline := time.Now().Add(time.Minute)
		for {
			events := realnode.PodEvents(c.client, c.ns, "mixed")
			if strings.Contains(events, "one sharing mode per GPU") {
				t.Logf("mixed-mode pod refused:%s", events)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no event explains why the mixed-mode pod does not start; events:%s", events)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	if p, err := c.client.CoreV1().Pods(c.ns).Get(context.Background(), "mixed", metav1.GetOptions{}); err != nil || p.Status.Phase == corev1.PodRunning {
		t.Errorf("mixed-mode pod: %v, phase %v; want it not running", err, p.Status.Phase)
	}
	c.deletePod(t, "mixed")

	for _, name := range append(mps, ts...) {
		c.deletePod(t, name)
	}
	for _, s := range specs {
		waitGone(t, s, 30*time.Second)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !contains(c.mpsRecords(t), "quit") {
		if time.Now().After(deadline) {
			t.Fatalf("MPS stand-in not told to quit after the last MPS pod went; record %v", c.mpsRecords(t))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestAgentRestart: tessera-node restarted while pods run re-prepares
// nothing, loses nothing, and leaves the pods alone.
func TestAgentRestart(t *testing.T) { setup(t).each(t, testAgentRestart) }

func testAgentRestart(t *testing.T, c *cluster) {
	c.claim(t, "excl", deviceclasses.Exclusive, 2, "")
	c.claim(t, "mps", deviceclasses.MPS, 4, "30Gi")
	for _, name := range []string{"excl", "mps"} {
		c.create(t, c.gpuPod(t, name, name))
	}
	before := map[string]corev1.ContainerStatus{}
	for _, name := range []string{"excl", "mps"} {
		p := c.waitRunning(t, name)
		c.printedEnv(t, name)
		before[name] = p.Status.ContainerStatuses[0]
	}
	if got := c.agent.metric(t, "tessera_node_prepared_claims", ""); got != 2 {
		t.Fatalf("prepared claims before the restart = %v, want 2", got)
	}

	c.agent.restart(t)

	if got := c.agent.metric(t, "tessera_node_prepared_claims", ""); got != 2 {
		t.Errorf("prepared claims after the restart = %v, want 2 (from the checkpoint)", got)
	}
	// Give the kubelet time to notice the re-registered plugin; it must not
	// prepare the running pods' claims again.
	time.Sleep(5 * time.Second)
	if got := c.agent.metric(t, "tessera_node_prepare_duration_seconds_count", `operation="prepare"`); got != 0 {
		t.Errorf("claims prepared again after the restart: %v", got)
	}
	if got := starts(c.mpsRecords(t)); got != 1 {
		t.Errorf("MPS stand-in started %d times, want once (adopted after the restart); record %v", got, c.mpsRecords(t))
	}
	for _, name := range []string{"excl", "mps"} {
		p, err := c.client.CoreV1().Pods(c.ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pod %s: %v", name, err)
		}
		after := p.Status.ContainerStatuses[0]
		if p.Status.Phase != corev1.PodRunning || after.ContainerID != before[name].ContainerID || after.RestartCount != 0 {
			t.Errorf("pod %s after the restart: phase %s, container %s (was %s), restarts %d", name, p.Status.Phase, after.ContainerID, before[name].ContainerID, after.RestartCount)
		}
	}
	// And the restarted agent still serves: a new claim is prepared.
	c.claim(t, "late", deviceclasses.Exclusive, 5, "")
	c.create(t, c.gpuPod(t, "late", "late"))
	c.waitRunning(t, "late")
	c.checkBinds(t, 3)
}

// TestBrokenCDISpec shows that these tests see what containerd applied:
// a spec tampered with after tessera-node wrote it gives the container a
// wrong env, which checkEnv reports; a spec that does not parse keeps the
// container from being created.
func TestBrokenCDISpec(t *testing.T) { setup(t).each(t, testBrokenCDISpec) }

func testBrokenCDISpec(t *testing.T, c *cluster) {
	signal := t.TempDir()

	tamper := func(name string, index int, edit func(spec []byte) []byte) {
		rc := c.claim(t, name, deviceclasses.Exclusive, index, "")
		p := c.gpuPod(t, name, name)
		// The init container holds the main one back until the spec is
		// edited; it does not use the claim, which is prepared before it.
		p.Spec.Volumes = []corev1.Volume{{Name: "signal", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: signal}}}}
		p.Spec.InitContainers = []corev1.Container{{
			Name: "wait", Image: realnode.BusyboxImage, ImagePullPolicy: corev1.PullNever,
			Command:      []string{"sh", "-c", "until [ -e /signal/" + name + " ]; do sleep 1; done"},
			VolumeMounts: []corev1.VolumeMount{{Name: "signal", MountPath: "/signal"}},
		}}
		c.create(t, p)
		spec := c.specPath(rc)
		deadline := time.Now().Add(time.Minute)
		var data []byte
		for {
			var err error
			if data, err = os.ReadFile(spec); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("tessera-node wrote no CDI spec %s", spec)
			}
			time.Sleep(100 * time.Millisecond)
		}
		// Replace atomically, under a name containerd's CDI cache ignores.
		tmp := filepath.Join(filepath.Dir(spec), ".tamper")
		if err := os.WriteFile(tmp, edit(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, spec); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // containerd reloads specs on change
		if err := os.WriteFile(filepath.Join(signal, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// A wrong UUID: the container runs, and the check every test uses fails.
	tamper("wrong-env", 6, func(spec []byte) []byte {
		var s map[string]any
		if err := json.Unmarshal(spec, &s); err != nil {
			t.Fatalf("spec tessera-node wrote is not JSON: %v", err)
		}
		_, uuid := c.allocatedUUID(t, "wrong-env")
		// Only the env values: the device name holds the UUID too.
		return []byte(strings.ReplaceAll(string(spec), "="+uuid, "=GPU-00000000-dead-beef-0000-000000000000"))
	})
	c.waitRunning(t, "wrong-env")
	_, uuid := c.allocatedUUID(t, "wrong-env")
	err := checkEnv(c.printedEnv(t, "wrong-env"), map[string]string{"TESSERA_GPU_UUIDS": uuid, "NVIDIA_VISIBLE_DEVICES": uuid})
	if err == nil {
		t.Fatalf("the env check passed on a tampered spec: the tests would not see a wrong CDI edit")
	}
	t.Logf("tampered spec caught: %v", err)

	// Not a spec at all: containerd cannot resolve the device and the
	// container is never created.
	tamper("bad-spec", 7, func([]byte) []byte { return []byte("{not a CDI spec") })
	deadline := time.Now().Add(time.Minute)
	for {
		p, err := c.client.CoreV1().Pods(c.ns).Get(context.Background(), "bad-spec", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == corev1.PodRunning {
			t.Fatalf("pod with a broken CDI spec is Running")
		}
		events := realnode.PodEvents(c.client, c.ns, "bad-spec")
		if len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Waiting != nil &&
			p.Status.ContainerStatuses[0].State.Waiting.Reason == "CreateContainerError" {
			t.Logf("broken spec stops the container: %s; events:%s", p.Status.ContainerStatuses[0].State.Waiting.Message, events)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod with a broken CDI spec: %s", realnode.DescribePod(c.client, c.ns, "bad-spec", p))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// refused waits for the pod's scheduler to report it unschedulable with a
// reason containing why, and checks that it stays unbound with its claims
// unallocated.
func (c *cluster) refused(t *testing.T, pod, why string) {
	t.Helper()
	p := realnode.WaitPod(t, c.client, c.ns, pod, time.Minute, "reported unschedulable", func(p *corev1.Pod) bool {
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && strings.Contains(cond.Message, why) {
				return true
			}
		}
		return false
	})
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodScheduled {
			t.Logf("pod %s unschedulable: %s: %s", pod, cond.Reason, cond.Message)
		}
	}
	if p.Spec.NodeName != "" {
		t.Errorf("refused pod %s is bound to %s", pod, p.Spec.NodeName)
	}
	for _, pc := range p.Spec.ResourceClaims {
		rc, err := c.client.ResourceV1().ResourceClaims(c.ns).Get(context.Background(), *pc.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("claim of %s: %v", pod, err)
		}
		if rc.Status.Allocation != nil {
			t.Errorf("claim %s of the refused pod is allocated: %+v", rc.Name, rc.Status.Allocation)
		}
	}
}

func starts(record []string) int {
	n := 0
	for _, r := range record {
		if strings.HasPrefix(r, "start") {
			n++
		}
	}
	return n
}

func contains(record []string, prefix string) bool {
	for _, r := range record {
		if strings.HasPrefix(r, prefix) {
			return true
		}
	}
	return false
}
