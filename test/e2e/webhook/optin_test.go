package webhook

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/controller/webhook"
	"github.com/tessera-gpu/tessera/test/controlplane"
)

// TestNamespaceOptIn: the opt-in webhook registered as the chart does
// (namespaceSelector tessera.dev/scheduler=enabled, matchConditions
// webhook.ScheduleMatchCondition, failurePolicy Fail): in a labelled
// namespace a pod naming no scheduler gets tessera-scheduler — also the
// pods kube-controller-manager's Job controller creates from an unchanged
// Job — a pod naming another keeps it, and other namespaces are untouched,
// also while the webhook is down.
func TestNamespaceOptIn(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a real kube-apiserver and kube-controller-manager; skipped with -short")
	}
	cp := controlplane.Start(t, controlplane.Options{})
	client := cp.Client(t)
	ctx := t.Context()
	opted := cp.CreateNamespace(t, "opted")
	if opted.Labels == nil {
		opted.Labels = map[string]string{}
	}
	opted.Labels[kube.LabelNamespaceScheduler] = kube.NamespaceSchedulerEnabled
	_, err := client.CoreV1().Namespaces().Update(ctx, opted, metav1.UpdateOptions{})
	require.NoError(t, err)
	plain := cp.CreateNamespace(t, "plain").Name

	srv, crt, stopServer := serve(t, ctx)

	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "tessera-opt-in"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:         "scheduler.pods.tessera.dev",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://" + srv.Addr() + webhook.SchedulePath), CABundle: crt},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)},
			}},
			MatchConditions:         []admissionregistrationv1.MatchCondition{{Name: "default-scheduler", Expression: webhook.ScheduleMatchCondition}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: webhook.ScheduleNamespaceSelector},
			TimeoutSeconds:          ptr.To(int32(5)),
		}},
	}
	_, err = client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, cfg, metav1.CreateOptions{})
	require.NoError(t, err)
	create := func(ns, name, scheduler string) (*v1.Pod, error) {
		p := pod(name, nil)
		p.Spec.SchedulerName = scheduler
		return client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	}
	require.Eventually(t, func() bool {
		p, err := client.CoreV1().Pods(opted.Name).Create(ctx, pod("probe", nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && p.Spec.SchedulerName == kube.SchedulerName
	}, 30*time.Second, 200*time.Millisecond, "the webhook configuration never took effect")

	p, err := create(opted.Name, "plain-pod", "")
	require.NoError(t, err)
	assert.Equal(t, kube.SchedulerName, p.Spec.SchedulerName)
	p, err = create(opted.Name, "named-default", v1.DefaultSchedulerName)
	require.NoError(t, err)
	assert.Equal(t, kube.SchedulerName, p.Spec.SchedulerName)
	p, err = create(opted.Name, "other", "volcano")
	require.NoError(t, err)
	assert.Equal(t, "volcano", p.Spec.SchedulerName, "a pod naming another scheduler is left alone")
	p, err = create(plain, "elsewhere", "")
	require.NoError(t, err)
	assert.Equal(t, v1.DefaultSchedulerName, p.Spec.SchedulerName, "a namespace without the label is untouched")

	// An unchanged Job: its pods, made by the Job controller, are ours.
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: opted.Name},
		Spec: batchv1.JobSpec{Template: v1.PodTemplateSpec{Spec: v1.PodSpec{
			RestartPolicy: v1.RestartPolicyNever, Containers: []v1.Container{{Name: "main", Image: "busybox"}},
		}}},
	}
	_, err = client.BatchV1().Jobs(opted.Name).Create(ctx, job, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		l, err := client.CoreV1().Pods(opted.Name).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=train"})
		return err == nil && len(l.Items) == 1 && l.Items[0].Spec.SchedulerName == kube.SchedulerName
	}, 60*time.Second, 200*time.Millisecond, "the Job's pod does not name tessera-scheduler")

	// Down: the opted-in namespace refuses pods rather than letting them
	// reach kube-scheduler; other namespaces do not notice.
	stopServer()
	_, err = create(opted.Name, "during-outage", "")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "scheduler.pods.tessera.dev")
	_, err = create(plain, "elsewhere-during-outage", "")
	require.NoError(t, err)
	_, err = create(opted.Name, "other-during-outage", "volcano")
	require.NoError(t, err, "a pod naming another scheduler is not sent (matchConditions)")
}
