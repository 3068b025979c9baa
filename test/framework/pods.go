package framework

import corev1 "k8s.io/api/core/v1"

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
