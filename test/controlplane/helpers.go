package controlplane

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// CreateNamespace creates a namespace and waits until pods can be created
// in it: the ServiceAccount admission plugin rejects pods until the
// namespace's default ServiceAccount exists, which KCM creates shortly
// after the namespace (without KCM, CreateNamespace creates it).
func (cp *ControlPlane) CreateNamespace(t testing.TB, name string) *corev1.Namespace {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := cp.Client(t)
	ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
	if cp.opts.NoControllerManager {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
		if _, err := client.CoreV1().ServiceAccounts(name).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating default ServiceAccount in %s: %v", name, err)
		}
		return ns
	}
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("waiting for the default ServiceAccount of namespace %s: %v", name, err)
	}
	return ns
}
