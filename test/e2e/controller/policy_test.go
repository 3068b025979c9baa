package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/test/framework"
)

// pendingPod is a pod nobody schedules (its scheduler does not exist), so
// it stays where the test puts it.
func pendingPod(name string, annotations map[string]string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}, Annotations: annotations},
		Spec:       policyPodSpec(),
	}
}

func policyPodSpec() v1.PodSpec {
	return v1.PodSpec{SchedulerName: "nobody", TerminationGracePeriodSeconds: ptr.To(int64(0)), RestartPolicy: v1.RestartPolicyNever,
		Containers: []v1.Container{{Name: "c", Image: "busybox"}}}
}

// metaPatch is a merge patch of a pod's labels and annotations; a nil value
// removes the key.
func metaPatch(labels, annotations map[string]any) []byte {
	m := map[string]any{}
	if labels != nil {
		m["labels"] = labels
	}
	if annotations != nil {
		m["annotations"] = annotations
	}
	b, _ := json.Marshal(map[string]any{"metadata": m})
	return b
}

// TestAssignmentPolicy: the tessera-gpu-assignment ValidatingAdmissionPolicy
// of deploy/rbac (applied as shipped) lets only tessera-controller's
// identity set, change or remove the assignment annotation, on CREATE and
// UPDATE, and lets that identity change nothing else of a pod. A user with
// edit rights and a cluster admin are denied with a message naming the
// annotation; updates that leave it alone pass, and so do the ReplicaSet and
// Job controllers creating pods from templates and removing the Job's
// finalizer from an annotated pod.
func TestAssignmentPolicy(t *testing.T) {
	cp := cluster(t)
	ctx := t.Context()
	admin := cp.Client(t)
	if err := framework.WaitAssignmentPolicy(ctx, admin); err != nil {
		t.Fatal(err)
	}
	ns := cp.CreateNamespace(t, "policy").Name
	t.Cleanup(func() { deletePods(t, admin, ns) })
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: "alice"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	alice, err := kubernetes.NewForConfig(cp.UserConfig("alice"))
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := kubernetes.NewForConfig(saConfig(cp, nil))
	if err != nil {
		t.Fatal(err)
	}
	const a1, a2 = `{"gpus":[0]}`, `{"gpus":[1]}`
	ann := func(v any) map[string]any { return map[string]any{assignment.Annotation: v} }
	create := func(c kubernetes.Interface, name string, annotations map[string]string) error {
		_, err := c.CoreV1().Pods(ns).Create(ctx, pendingPod(name, annotations), metav1.CreateOptions{})
		return err
	}
	patch := func(c kubernetes.Interface, name string, p []byte) error {
		_, err := c.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, p, metav1.PatchOptions{})
		return err
	}
	if err := create(alice, "plain", nil); err != nil {
		t.Fatalf("alice creates a pod without the annotation: %v", err)
	}
	const userDenied = "annotation " + assignment.Annotation + " is written by tessera-controller only"
	const ctrlDenied = "tessera-controller may change only the annotation " + assignment.Annotation
	// In order: each step starts from the state the previous ones left.
	for _, tc := range []struct {
		name    string
		do      func() error
		wantErr string // "" for accepted
	}{
		{"alice creates a pod with the annotation", func() error { return create(alice, "forged", map[string]string{assignment.Annotation: a1}) }, userDenied},
		{"an admin creates a pod with the annotation", func() error { return create(admin, "forged", map[string]string{assignment.Annotation: "x"}) }, userDenied},
		{"alice adds it to her pod", func() error { return patch(alice, "plain", metaPatch(nil, ann(a1))) }, userDenied},
		{"the controller adds it", func() error { return patch(ctrl, "plain", metaPatch(nil, ann(a1))) }, ""},
		{"alice changes it", func() error { return patch(alice, "plain", metaPatch(nil, ann(a2))) }, userDenied},
		{"alice removes it", func() error { return patch(alice, "plain", metaPatch(nil, ann(nil))) }, userDenied},
		{"an admin changes it", func() error { return patch(admin, "plain", metaPatch(nil, ann(a2))) }, userDenied},
		{"alice changes a label and another annotation of the annotated pod", func() error {
			return patch(alice, "plain", metaPatch(map[string]any{"team": "a"}, map[string]any{"note": "mine"}))
		}, ""},
		{"the controller changes the assignment", func() error { return patch(ctrl, "plain", metaPatch(nil, ann(a2))) }, ""},
		{"the controller changes a label", func() error { return patch(ctrl, "plain", metaPatch(map[string]any{"team": "b"}, nil)) }, ctrlDenied},
		{"the controller changes another annotation with it", func() error {
			return patch(ctrl, "plain", metaPatch(nil, map[string]any{assignment.Annotation: a1, "note": "theirs"}))
		}, ctrlDenied},
		// The pod grouper's annotations: added, never changed or removed.
		{"the controller adds the pod grouper's group", func() error {
			return patch(ctrl, "plain", metaPatch(nil, map[string]any{kube.AnnotationPodGroup: "job-a", "tessera.dev/pod-subgroup": "w-0"}))
		}, ""},
		{"the controller changes the group", func() error {
			return patch(ctrl, "plain", metaPatch(nil, map[string]any{kube.AnnotationPodGroup: "job-b"}))
		}, ctrlDenied},
		{"the controller removes the group", func() error {
			return patch(ctrl, "plain", metaPatch(nil, map[string]any{kube.AnnotationPodGroup: nil}))
		}, ctrlDenied},
	} {
		err := tc.do()
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: want accepted, got %v", tc.name, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: want denied with %q, got %v", tc.name, tc.wantErr, err)
		}
	}
	p, err := admin.CoreV1().Pods(ns).Get(ctx, "plain", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Annotations[assignment.Annotation]; got != a2 || p.Labels["team"] != "a" || p.Annotations["note"] != "mine" {
		t.Errorf("pod after the steps: assignment %q, label team %q, note %q; want %q, a, mine", got, p.Labels["team"], p.Annotations["note"], a2)
	}

	t.Run("workload controllers are not affected", func(t *testing.T) {
		testWorkloadsUnaffected(t, admin, ctrl, ns)
	})
}

// testWorkloadsUnaffected: a ReplicaSet creates its pods from a template
// without the annotation; a Job's pod, annotated by the controller, ends
// and the Job controller removes its tracking finalizer (an UPDATE of an
// annotated pod by another identity) and counts it.
func testWorkloadsUnaffected(t *testing.T, admin, ctrl kubernetes.Interface, ns string) {
	ctx := t.Context()
	tmpl := v1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "rs"}}, Spec: policyPodSpec()}
	tmpl.Spec.RestartPolicy = v1.RestartPolicyAlways
	if _, err := admin.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "rs"},
		Spec:       appsv1.ReplicaSetSpec{Replicas: ptr.To(int32(2)), Selector: &metav1.LabelSelector{MatchLabels: tmpl.Labels}, Template: tmpl},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ReplicaSet's 2 pods", 60*time.Second, func() (bool, string) {
		rs, err := admin.AppsV1().ReplicaSets(ns).Get(ctx, "rs", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return rs.Status.Replicas == 2, fmt.Sprintf("%d replicas, conditions %v", rs.Status.Replicas, rs.Status.Conditions)
	})

	jobTmpl := v1.PodTemplateSpec{Spec: policyPodSpec()}
	if _, err := admin.BatchV1().Jobs(ns).Create(ctx, &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "job"},
		Spec:       batchv1.JobSpec{Template: jobTmpl, BackoffLimit: ptr.To(int32(0))},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pod *v1.Pod
	eventually(t, "the Job's pod", 60*time.Second, func() (bool, string) {
		l, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "job-name=job"})
		if err != nil || len(l.Items) == 0 {
			return false, fmt.Sprintf("%v", err)
		}
		pod = &l.Items[0]
		return true, ""
	})
	if _, err := ctrl.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.MergePatchType, metaPatch(nil, map[string]any{assignment.Annotation: `{"gpus":[0]}`}), metav1.PatchOptions{}); err != nil {
		t.Fatalf("the controller annotates the Job's pod: %v", err)
	}
	// The pod ends (what the kubelet would write).
	err := retryGet(ctx, admin, ns, pod.Name, func(p *v1.Pod) error {
		p.Status.Phase = v1.PodSucceeded
		_, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Job complete and its pod's finalizer removed", 60*time.Second, func() (bool, string) {
		j, err := admin.BatchV1().Jobs(ns).Get(ctx, "job", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		p, err := admin.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return j.Status.Succeeded == 1 && len(p.Finalizers) == 0 && p.Annotations[assignment.Annotation] != "",
			fmt.Sprintf("succeeded %d, pod finalizers %v", j.Status.Succeeded, p.Finalizers)
	})
}

// retryGet reads a pod and applies update, again on a conflict.
func retryGet(ctx context.Context, c kubernetes.Interface, ns, name string, update func(*v1.Pod) error) error {
	var err error
	for range 10 {
		var p *v1.Pod
		if p, err = c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
		if err = update(p); err == nil || !strings.Contains(err.Error(), "the object has been modified") {
			return err
		}
	}
	return err
}
