package realnode

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// BusyboxPod returns a pod that runs script with sh in the busybox image,
// never pulled and never restarted. It is bound to the node when node is
// set (no scheduler needed) and gets no service-account token.
func BusyboxPod(namespace, name, node, script string) *corev1.Pod {
	no := false
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &no,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:            "main",
				Image:           BusyboxImage,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"sh", "-c", script},
			}},
		},
	}
}

// WaitPod polls the pod until done says so, failing the test after timeout
// with the pod's status and events.
func WaitPod(t testing.TB, client kubernetes.Interface, namespace, name string, timeout time.Duration, what string, done func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last *corev1.Pod
	for {
		p, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			last = p
			if done(p) {
				return p
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod %s/%s: not %s after %s; %s", namespace, name, what, timeout, DescribePod(client, namespace, name, last))
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// PodPhase is a WaitPod condition: the pod is in one of phases.
func PodPhase(phases ...corev1.PodPhase) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool {
		for _, ph := range phases {
			if p.Status.Phase == ph {
				return true
			}
		}
		return false
	}
}

// DescribePod renders what helps to debug a pod that got stuck: phase,
// container states and events.
func DescribePod(client kubernetes.Interface, namespace, name string, p *corev1.Pod) string {
	s := "pod not found"
	if p != nil {
		s = fmt.Sprintf("phase %s, node %q", p.Status.Phase, p.Spec.NodeName)
		for _, c := range p.Status.Conditions {
			if c.Status != corev1.ConditionTrue && c.Message != "" {
				s += fmt.Sprintf("; %s: %s", c.Type, c.Message)
			}
		}
		for _, cs := range p.Status.ContainerStatuses {
			switch {
			case cs.State.Waiting != nil:
				s += fmt.Sprintf("; %s waiting: %s %s", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
			case cs.State.Terminated != nil:
				s += fmt.Sprintf("; %s terminated: %s exit %d %s", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.ExitCode, cs.State.Terminated.Message)
			}
		}
	}
	return s + "; events: " + PodEvents(client, namespace, name)
}

// PodEvents lists the pod's events as "Reason: message" lines.
func PodEvents(client kubernetes.Interface, namespace, name string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	evs, err := client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return fmt.Sprintf("(listing events: %v)", err)
	}
	s := ""
	for _, e := range evs.Items {
		s += fmt.Sprintf("\n  %s %s: %s", e.Type, e.Reason, e.Message)
	}
	return s
}

// PodLogs returns the logs of the pod's (only) container, through the
// apiserver and the kubelet, as kubectl logs reads them.
func PodLogs(t testing.TB, client kubernetes.Interface, namespace, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := client.CoreV1().Pods(namespace).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("logs of pod %s/%s: %v", namespace, name, err)
	}
	return string(b)
}
