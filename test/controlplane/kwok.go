package controlplane

import (
	"context"
	"fmt"
	"maps"
	"os"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Kwok manages exactly the nodes that carry this annotation, so a real
// kubelet's node next to kwok nodes is left alone.
const (
	KwokAnnotation      = "kwok.x-k8s.io/node"
	KwokAnnotationValue = "fake"
	// KwokNodeLabel marks kwok nodes for tests that want to select them.
	KwokNodeLabel = "type"
	// KwokNodeLabelValue is the value of KwokNodeLabel on kwok nodes.
	KwokNodeLabelValue = "kwok"
	// KwokPodCIDR is where kwok takes pod IPs from (a /16: scale tests run
	// thousands of pods).
	KwokPodCIDR = "10.0.0.0/16"
)

// kwokStages tells kwok how its fake kubelets behave: nodes become Ready at
// once (kwok keeps their Lease fresh, so they stay Ready), pods bound to
// them become Running at once, and pods being deleted are removed (no
// kubelet would ever confirm it otherwise). Other pod phases (e.g.
// Succeeded) are left to the tests, which can write pod status as admin.
const kwokStages = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: tessera-node-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: NotIn
      values: ['True']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - type: {{ .type | Quote }}
        status: {{ .status | Quote }}
        reason: {{ .reason | Quote }}
        message: {{ .message | Quote }}
        lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
      {{ end }}
      {{ with .status.capacity }}
      capacity:
      {{ YAML . 1 }}
      {{ else }}
      capacity: {cpu: "32", memory: 256Gi, pods: "110"}
      {{ end }}
      {{ with .status.allocatable }}
      allocatable:
      {{ YAML . 1 }}
      {{ else }}
      allocatable: {cpu: "32", memory: 256Gi, pods: "110"}
      {{ end }}
      nodeInfo:
        architecture: amd64
        operatingSystem: linux
        kubeletVersion: ` + KubeVersion + `
        kubeProxyVersion: ` + KubeVersion + `
        containerRuntimeVersion: kwok
        kernelVersion: kwok
        osImage: kwok
        machineID: ""
        systemUUID: ""
        bootID: ""
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: tessera-pod-running
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: .metadata.deletionTimestamp
      operator: DoesNotExist
    - key: .status.phase
      operator: In
      values: [Pending]
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: NotIn
      values: ['True']
  next:
    statusTemplate: |
      {{ $now := Now }}
      phase: Running
      startTime: {{ $now | Quote }}
      conditions:
      - {type: PodReadyToStartContainers, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
      {{ range .spec.readinessGates }}
      - {type: {{ .conditionType | Quote }}, status: "True", lastTransitionTime: {{ $now | Quote }}}
      {{ end }}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: true
        started: true
        restartCount: 0
        state: {running: {startedAt: {{ $now | Quote }}}}
      {{ end }}
      {{ with .spec.initContainers }}
      initContainerStatuses:
      {{ range . }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: true
        restartCount: 0
        state: {terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now | Quote }}, finishedAt: {{ $now | Quote }}}}
      {{ end }}
      {{ end }}
      {{ with NodeIPsWith .spec.nodeName }}
      hostIP: {{ index . 0 | Quote }}
      hostIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      {{ with PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      podIP: {{ index . 0 | Quote }}
      podIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: tessera-pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: .metadata.deletionTimestamp
      operator: Exists
  next:
    delete: true
`

// KubeVersion is the version the harness's binaries report.
const KubeVersion = "v1.37.2"

// StartKwok runs the kwok controller against the control plane. It manages
// nodes annotated KwokAnnotation=KwokAnnotationValue (AddKwokNode makes
// such nodes) and the pods bound to them. It is stopped with the control
// plane; calling it again is a no-op.
func (cp *ControlPlane) StartKwok(t testing.TB) {
	t.Helper()
	cp.mu.Lock()
	running := cp.kwok != nil
	cp.mu.Unlock()
	if running {
		return
	}
	config := cp.path("kwok.yaml")
	if err := os.WriteFile(config, []byte(kwokStages), 0o644); err != nil {
		t.Fatalf("writing kwok stages: %v", err)
	}
	kubeconfig, err := cp.writeKubeconfig("kwok.kubeconfig", cp.UserConfig("kwok-controller", "system:masters"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	// KWOK_WORKDIR keeps kwok from reading ~/.kwok/kwok.yaml.
	env := []string{"KWOK_WORKDIR=" + cp.path("kwok-workdir")}
	p, err := cp.startEnv("kwok", "kwok", env,
		"--kubeconfig="+kubeconfig,
		"--config="+config,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector="+KwokAnnotation+"="+KwokAnnotationValue,
		"--cidr="+KwokPodCIDR,
		"--node-lease-duration-seconds=40",
	)
	if err != nil {
		t.Fatalf("starting kwok: %v", err)
	}
	cp.mu.Lock()
	cp.kwok = p
	cp.mu.Unlock()
	// kwok has no health endpoint unless it serves a kubelet port; a
	// crash on bad flags or config shows within a second.
	time.Sleep(time.Second)
	if done, werr := p.Exited(); done {
		t.Fatalf("kwok exited at start (%v); last lines of %s:\n%s", werr, p.LogPath, p.Tail(40))
	}
}

var kwokNodeSeq atomic.Uint32

// AddKwokNode creates a kwok node with the given extra labels (32 CPUs,
// 256Gi memory, 110 pods) and waits until it is Ready and schedulable.
// StartKwok must have been called.
func (cp *ControlPlane) AddKwokNode(t testing.TB, name string, labels map[string]string) {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	cp.AddKwokNodeWith(t, node)
}

// AddKwokNodeWith creates node as a kwok node and waits until it is Ready
// and schedulable. It adds kwok's annotation, the usual node labels and
// KwokNodeLabel, a unique InternalIP, and default capacity unless node
// sets Status.Capacity; taints, extra labels and allocatable are kept.
func (cp *ControlPlane) AddKwokNodeWith(t testing.TB, node *corev1.Node) *corev1.Node {
	t.Helper()
	cp.mu.Lock()
	kwok := cp.kwok
	cp.mu.Unlock()
	if kwok == nil {
		t.Fatalf("AddKwokNode(%s): call StartKwok first", node.Name)
	}
	node = node.DeepCopy()
	node.Annotations = maps.Clone(node.Annotations)
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[KwokAnnotation] = KwokAnnotationValue
	labels := map[string]string{
		"kubernetes.io/hostname": node.Name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     "amd64",
		KwokNodeLabel:            KwokNodeLabelValue,
	}
	maps.Copy(labels, node.Labels)
	node.Labels = labels
	if node.Status.Capacity == nil {
		node.Status.Capacity = corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("32"),
			corev1.ResourceMemory: resource.MustParse("256Gi"),
			corev1.ResourcePods:   resource.MustParse("110"),
		}
	}
	if node.Status.Allocatable == nil {
		node.Status.Allocatable = node.Status.Capacity.DeepCopy()
	}
	if len(node.Status.Addresses) == 0 {
		// Distinct per node (from 10.255.0.0/16), so address-based logic
		// in tests can tell nodes apart.
		n := kwokNodeSeq.Add(1)
		node.Status.Addresses = []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.255.%d.%d", (n>>8)&0xff, n&0xff)},
			{Type: corev1.NodeHostName, Address: node.Name},
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := cp.Client(t)
	created, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating kwok node %s: %v", node.Name, err)
	}
	var last *corev1.Node
	err = cp.waitFor(ctx, "kwok node "+node.Name+" to be Ready", []*process{kwok}, func() (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = n
		if !nodeReady(n) {
			return false, nil
		}
		// KCM's node lifecycle controller taints a new node not-ready
		// until it has seen it Ready; the scheduler would skip it.
		for _, taint := range n.Spec.Taints {
			if taint.Key == corev1.TaintNodeNotReady || taint.Key == corev1.TaintNodeUnreachable {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("%v\nnode: %+v", err, last)
	}
	if last != nil {
		return last
	}
	return created
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
