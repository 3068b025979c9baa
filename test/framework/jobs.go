package framework

import (
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1alpha3 "k8s.io/api/scheduling/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/test/controlplane"
)

// GangJob is an Indexed batch Job of n pods (completions = parallelism)
// with Kubernetes 1.37's gang policy (spec.scheduling.schedulingPolicy.gang,
// minCount n), as a person writes it for tessera-scheduler: nothing on it
// is Tessera's but the scheduler name and the queue label. Each pod asks
// for the GPUs of the ResourceClaimTemplate claimTemplate, at priorityClass
// ("" for none), and tolerates kwok's nodes. Where the Job controller
// serves the policy (WorkloadWithJob) it makes the Workload and PodGroup;
// where the API is not served the field is dropped and the pod grouper
// makes the Job a gang from its shape. One manifest for both, so the tests
// of either case schedule the same Job.
func GangJob(ns, name string, n int32, queue, claimTemplate, priorityClass string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To(n), Completions: ptr.To(n),
			CompletionMode: ptr.To(batchv1.IndexedCompletion),
			BackoffLimit:   ptr.To[int32](0),
			Scheduling: &batchv1.JobSchedulingConfiguration{SchedulingPolicy: &schedulingv1alpha3.WorkloadPodGroupSchedulingPolicy{
				Gang: &schedulingv1alpha3.WorkloadPodGroupGangSchedulingPolicy{MinCount: ptr.To(n)}}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{kube.LabelQueue: queue}},
				Spec: corev1.PodSpec{
					SchedulerName:     kube.SchedulerName,
					PriorityClassName: priorityClass,
					RestartPolicy:     corev1.RestartPolicyNever,
					Containers: []corev1.Container{{Name: "main", Image: "busybox",
						Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
					ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(claimTemplate)}},
					Tolerations:    []corev1.Toleration{{Key: controlplane.KwokAnnotation, Operator: corev1.TolerationOpExists}},
				},
			},
		},
	}
}
