// Package framework holds what Tessera's integration tests share: installing
// the CRDs and DeviceClasses on a real control plane.
package framework

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/api/scheduling/crds"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
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
