// Package framework holds what Tessera's integration tests share: installing
// the CRDs and DeviceClasses on a real control plane.
package framework

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/api/scheduling/crds"
	"github.com/tessera-gpu/tessera/deploy/rbac"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
	"github.com/tessera-gpu/tessera/internal/assignment"
)

// CRDGVR is apiextensions.k8s.io/v1 customresourcedefinitions.
var CRDGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallCRDs creates Tessera's CRDs (api/scheduling/crds) and waits until
// the API server serves them.
func InstallCRDs(ctx context.Context, dyn dynamic.Interface) error {
	var names []string
	err := fs.WalkDir(crds.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".yaml" {
			return err
		}
		data, err := crds.FS.ReadFile(path)
		if err != nil {
			return err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); err == io.EOF {
				return nil
			} else if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			if _, err := dyn.Resource(CRDGVR).Create(ctx, u, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("creating CRD %s: %w", u.GetName(), err)
			}
			names = append(names, u.GetName())
		}
	})
	if err != nil {
		return err
	}
	for _, name := range names {
		deadline := time.Now().Add(30 * time.Second)
		for !established(ctx, dyn, name) {
			if time.Now().After(deadline) {
				return fmt.Errorf("CRD %s not established after 30s", name)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

func established(ctx context.Context, dyn dynamic.Interface, name string) bool {
	u, err := dyn.Resource(CRDGVR).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, _ := c.(map[string]any); m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// ApplyDeviceClasses creates the DeviceClasses tessera ships.
func ApplyDeviceClasses(ctx context.Context, client kubernetes.Interface) error {
	classes, err := deviceclasses.Load()
	if err != nil {
		return err
	}
	for _, c := range classes {
		if _, err := client.ResourceV1().DeviceClasses().Create(ctx, c, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating DeviceClass %s: %w", c.Name, err)
		}
	}
	return nil
}

// ApplyControllerRBAC creates every object of deploy/rbac/tessera-controller.yaml,
// exactly as shipped (the namespace must exist): the RBAC and the
// tessera-gpu-assignment admission policy. The API server takes a moment to
// load the policy; WaitAssignmentPolicy waits for it.
func ApplyControllerRBAC(ctx context.Context, client kubernetes.Interface) error {
	return applyRBAC(ctx, client, rbac.ControllerYAML)
}

// ApplyShadowRBAC creates every object of
// deploy/rbac/tessera-controller-shadow.yaml, exactly as shipped: shadow
// mode's ServiceAccount, read-only ClusterRole and Lease Role.
func ApplyShadowRBAC(ctx context.Context, client kubernetes.Interface) error {
	return applyRBAC(ctx, client, rbac.ShadowYAML)
}

// applyRBAC creates every object of manifests.
func applyRBAC(ctx context.Context, client kubernetes.Interface, manifests []byte) error {
	sch := runtime.NewScheme()
	_ = corev1.AddToScheme(sch)
	_ = rbacv1.AddToScheme(sch)
	_ = admissionregistrationv1.AddToScheme(sch)
	decoder := serializer.NewCodecFactory(sch).UniversalDeserializer()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifests)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading RBAC manifests: %w", err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			return fmt.Errorf("decoding RBAC manifest: %w", err)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = client.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = client.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = client.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = client.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			_, err = client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			_, err = client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, metav1.CreateOptions{})
		default:
			err = fmt.Errorf("unexpected kind %T in the RBAC manifests", obj)
		}
		if err != nil {
			return fmt.Errorf("applying RBAC manifest: %w", err)
		}
	}
}

// WaitAssignmentPolicy waits until the API server enforces the
// tessera-gpu-assignment policy of ApplyControllerRBAC: a dry-run pod
// carrying the assignment annotation, created by client (not the
// controller), is denied.
func WaitAssignmentPolicy(ctx context.Context, client kubernetes.Interface) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: rbac.Namespace, Name: "policy-probe", Annotations: map[string]string{assignment.Annotation: `{"gpus":[0]}`}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := client.CoreV1().Pods(rbac.Namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), assignment.Annotation) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the %s policy is not enforced 30s after it was created (last answer: %v)", "tessera-gpu-assignment", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
