package framework

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
)

// SchedulerName is the scheduler Tessera's pods name.
const SchedulerName = "tessera-scheduler"

// Workload is one object of a workload controller's kind as a person would
// submit it, and how to find the pods its controller makes.
type Workload struct {
	Object *unstructured.Unstructured
	GVR    schema.GroupVersionResource
	// Controller runs it (StartOperator's name; "" for kube-controller-manager).
	Controller string
	// PodSelector selects its pods; Pods is how many its controller makes.
	PodSelector string
	Pods        int
}

// PodShape is what every pod of a Workload asks for.
type PodShape struct {
	// Scheduler is spec.schedulerName of the template (default SchedulerName).
	Scheduler string
	// GPUs are whole GPUs in limits (nvidia.com/gpu); 0 asks for none.
	GPUs int
	// Labels go on the template (e.g. tessera.dev/queue).
	Labels map[string]string
}

// podTemplate is a pod template with one container named container.
func (s PodShape) podTemplate(container string) map[string]any {
	sched := s.Scheduler
	if sched == "" {
		sched = SchedulerName
	}
	c := map[string]any{"name": container, "image": "registry.k8s.io/pause:3.10"}
	if s.GPUs > 0 {
		c["resources"] = map[string]any{"limits": map[string]any{"nvidia.com/gpu": strconv.Itoa(s.GPUs)}}
	}
	tmpl := map[string]any{"spec": map[string]any{
		"schedulerName": sched, "restartPolicy": "Never", "containers": []any{c},
	}}
	if len(s.Labels) > 0 {
		labels := map[string]any{}
		for k, v := range s.Labels {
			labels[k] = v
		}
		tmpl["metadata"] = map[string]any{"labels": labels}
	}
	return tmpl
}

func object(apiVersion, kind, ns, name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": apiVersion, "kind": kind,
		"metadata": map[string]any{"namespace": ns, "name": name},
		"spec":     spec,
	}}
}

// PyTorchJob is a Kubeflow PyTorchJob of one master and workers workers.
func PyTorchJob(ns, name string, workers int, pod PodShape) Workload {
	replica := func(n int) map[string]any {
		tmpl := pod.podTemplate("pytorch")
		tmpl["spec"].(map[string]any)["restartPolicy"] = "OnFailure"
		return map[string]any{"replicas": int64(n), "restartPolicy": "OnFailure", "template": tmpl}
	}
	spec := map[string]any{"pytorchReplicaSpecs": map[string]any{"Master": replica(1), "Worker": replica(workers)}}
	return Workload{
		Object:      object("kubeflow.org/v1", "PyTorchJob", ns, name, spec),
		GVR:         schema.GroupVersionResource{Group: "kubeflow.org", Version: "v1", Resource: "pytorchjobs"},
		Controller:  TrainingOperator,
		PodSelector: "training.kubeflow.org/job-name=" + name,
		Pods:        1 + workers,
	}
}

// MPIJob is a Kubeflow training-operator MPIJob (kubeflow.org/v1) of one
// launcher (launcher's shape) and workers workers (worker's shape). The
// operator creates the launcher at once, beside the workers, not after
// them: so launcher and workers can be one gang.
func MPIJob(ns, name string, launcher PodShape, workers int, worker PodShape) Workload {
	replica := func(n int, pod PodShape, container string) map[string]any {
		return map[string]any{"replicas": int64(n), "restartPolicy": "Never", "template": pod.podTemplate(container)}
	}
	spec := map[string]any{"slotsPerWorker": int64(1), "mpiReplicaSpecs": map[string]any{
		"Launcher": replica(1, launcher, "mpi-launcher"), "Worker": replica(workers, worker, "mpi-worker"),
	}}
	return Workload{
		Object:      object("kubeflow.org/v1", "MPIJob", ns, name, spec),
		GVR:         schema.GroupVersionResource{Group: "kubeflow.org", Version: "v1", Resource: "mpijobs"},
		Controller:  TrainingOperator,
		PodSelector: "training.kubeflow.org/job-name=" + name,
		Pods:        1 + workers,
	}
}

// JobSetOf is a JobSet with one replicated job per entry of parallelism,
// each one replica of a Job running that many pods at once.
func JobSetOf(ns, name string, parallelism []int, pod PodShape) Workload {
	var jobs []any
	total := 0
	for i, p := range parallelism {
		jobs = append(jobs, map[string]any{"name": fmt.Sprintf("rj%d", i), "replicas": int64(1), "template": map[string]any{
			"spec": map[string]any{"parallelism": int64(p), "completions": int64(p), "backoffLimit": int64(0), "template": pod.podTemplate("c")},
		}})
		total += p
	}
	return Workload{
		Object:      object("jobset.x-k8s.io/v1alpha2", "JobSet", ns, name, map[string]any{"replicatedJobs": jobs}),
		GVR:         schema.GroupVersionResource{Group: "jobset.x-k8s.io", Version: "v1alpha2", Resource: "jobsets"},
		Controller:  JobSet,
		PodSelector: "jobset.sigs.k8s.io/jobset-name=" + name,
		Pods:        total,
	}
}

// LeaderWorkerSet is an LWS of replicas groups of size pods (a leader and
// size-1 workers), all from one template.
func LeaderWorkerSet(ns, name string, replicas, size int, pod PodShape) Workload {
	tmpl := pod.podTemplate("c")
	tmpl["spec"].(map[string]any)["restartPolicy"] = "Always" // the only one a StatefulSet takes
	spec := map[string]any{"replicas": int64(replicas), "leaderWorkerTemplate": map[string]any{
		"size": int64(size), "workerTemplate": tmpl,
	}}
	return Workload{
		Object:      object("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", ns, name, spec),
		GVR:         schema.GroupVersionResource{Group: "leaderworkerset.x-k8s.io", Version: "v1", Resource: "leaderworkersets"},
		Controller:  LWS,
		PodSelector: "leaderworkerset.sigs.k8s.io/name=" + name,
		Pods:        replicas * size,
	}
}

// RayCluster is a KubeRay RayCluster of a head (head's shape) and one worker
// group of workers pods (minReplicas = replicas = maxReplicas).
func RayCluster(ns, name string, head PodShape, workers int, worker PodShape) Workload {
	n := int64(workers)
	spec := map[string]any{
		"headGroupSpec": map[string]any{"rayStartParams": map[string]any{}, "template": head.podTemplate("ray-head")},
		"workerGroupSpecs": []any{map[string]any{
			"groupName": "gpu", "replicas": n, "minReplicas": n, "maxReplicas": n,
			"rayStartParams": map[string]any{}, "template": worker.podTemplate("ray-worker"),
		}},
	}
	return Workload{
		Object:      object("ray.io/v1", "RayCluster", ns, name, spec),
		GVR:         schema.GroupVersionResource{Group: "ray.io", Version: "v1", Resource: "rayclusters"},
		Controller:  KubeRay,
		PodSelector: "ray.io/cluster=" + name,
		Pods:        1 + workers,
	}
}

// TrainJob is a Kubeflow trainer TrainJob of nodes nodes with gpus GPUs
// each, on the TrainingRuntime runtime (see TrainingRuntime).
func TrainJob(ns, name, runtime string, nodes, gpus int) Workload {
	trainer := map[string]any{"numNodes": int64(nodes)}
	if gpus > 0 {
		trainer["resourcesPerNode"] = map[string]any{"limits": map[string]any{"nvidia.com/gpu": strconv.Itoa(gpus)}}
	}
	spec := map[string]any{"runtimeRef": map[string]any{"name": runtime, "kind": "TrainingRuntime"}, "trainer": trainer}
	return Workload{
		Object:      object("trainer.kubeflow.org/v1alpha1", "TrainJob", ns, name, spec),
		GVR:         schema.GroupVersionResource{Group: "trainer.kubeflow.org", Version: "v1alpha1", Resource: "trainjobs"},
		Controller:  Trainer,
		PodSelector: "jobset.sigs.k8s.io/jobset-name=" + name,
		Pods:        nodes,
	}
}

// TrainingRuntimeGVR is trainer's namespaced runtime.
var TrainingRuntimeGVR = schema.GroupVersionResource{Group: "trainer.kubeflow.org", Version: "v1alpha1", Resource: "trainingruntimes"}

// TrainingRuntime is the torch-distributed ClusterTrainingRuntime trainer
// ships (from its module, in op.Dir/runtimes), made a TrainingRuntime of ns
// whose pods name scheduler and carry labels: TrainJob has no field for the
// scheduler, so a platform team sets it in the runtime.
func TrainingRuntime(op *Operator, ns, name, scheduler string, labels map[string]string) (*unstructured.Unstructured, error) {
	docs, err := readYAMLDocs(filepath.Join(op.Dir, "runtimes", "torch_distributed.yaml"))
	if err != nil {
		return nil, err
	}
	if len(docs) != 1 || docs[0].GetKind() != "ClusterTrainingRuntime" {
		return nil, fmt.Errorf("torch_distributed.yaml: want one ClusterTrainingRuntime, got %d objects", len(docs))
	}
	rt := docs[0]
	rt.SetKind("TrainingRuntime")
	rt.SetNamespace(ns)
	rt.SetName(name)
	jobs, _, err := unstructured.NestedSlice(rt.Object, "spec", "template", "spec", "replicatedJobs")
	if err != nil || len(jobs) == 0 {
		return nil, fmt.Errorf("torch_distributed.yaml: no replicatedJobs (%v)", err)
	}
	for i := range jobs {
		job := jobs[i].(map[string]any)
		if err := unstructured.SetNestedField(job, scheduler, "template", "spec", "template", "spec", "schedulerName"); err != nil {
			return nil, err
		}
		for k, v := range labels {
			if err := unstructured.SetNestedField(job, v, "template", "spec", "template", "metadata", "labels", k); err != nil {
				return nil, err
			}
		}
	}
	return rt, unstructured.SetNestedSlice(rt.Object, jobs, "spec", "template", "spec", "replicatedJobs")
}

// WaitPods waits until selector matches exactly n pods in ns and returns
// them; an error after timeout, saying how many it saw.
func WaitPods(ctx context.Context, client kubernetes.Interface, ns, selector string, n int, timeout time.Duration) ([]corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	seen := -1
	for {
		list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err == nil {
			seen = len(list.Items)
			if seen == n {
				return list.Items, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("pods %q in %s: want %d, saw %d after %v (last error: %v)", selector, ns, n, seen, timeout, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
