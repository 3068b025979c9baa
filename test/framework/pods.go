package framework

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
)

// Bound counts the pods that have a node.
func Bound(pods []corev1.Pod) int {
	n := 0
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			n++
		}
	}
	return n
}

// PendingReason is the PodScheduled condition a scheduler writes on a pod
// it cannot place, as "reason: message".
func PendingReason(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return fmt.Sprintf("%s: %s", c.Reason, c.Message)
		}
	}
	return "no PodScheduled condition"
}
