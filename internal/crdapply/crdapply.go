// Package crdapply applies CustomResourceDefinitions with server-side apply
// and waits for them to be served: the chart's pre-install/pre-upgrade hook
// (`tessera-controller apply-crds`), because Helm installs a chart's crds/
// once and never upgrades them.
package crdapply

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"
)

// FieldManager owns the fields the hook applies.
const FieldManager = "tessera-crds"

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// Parse decodes the CRDs of one YAML stream (documents separated by ---);
// anything that is not a named apiextensions.k8s.io/v1
// CustomResourceDefinition is an error naming the document.
func Parse(source string, data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for i := 1; ; i++ {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("%s: document %d: %w", source, i, err)
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if gvk := u.GroupVersionKind(); gvk.Group != crdResource.Group || gvk.Version != "v1" || gvk.Kind != "CustomResourceDefinition" {
			return nil, fmt.Errorf("%s: document %d is %q %q, want apiextensions.k8s.io/v1 CustomResourceDefinition", source, i, u.GetAPIVersion(), u.GetKind())
		}
		if u.GetName() == "" {
			return nil, fmt.Errorf("%s: document %d: CustomResourceDefinition without metadata.name", source, i)
		}
		out = append(out, u)
	}
}

// ReadDir parses every *.yaml file of dir, in name order.
func ReadDir(dir string) ([]*unstructured.Unstructured, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []*unstructured.Unstructured
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("reading CRDs: %w", err)
		}
		crds, err := Parse(f, data)
		if err != nil {
			return nil, err
		}
		out = append(out, crds...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no CustomResourceDefinition in %s/*.yaml", dir)
	}
	return out, nil
}

// Apply server-side applies each CRD (forcing ownership of its fields,
// whoever created it: Helm's crds/, kubectl, an older hook) and waits, up to
// timeout, until each is Established with its stored versions served.
func Apply(ctx context.Context, client dynamic.Interface, crds []*unstructured.Unstructured, timeout time.Duration) error {
	logger := klog.FromContext(ctx)
	res := client.Resource(crdResource)
	for _, crd := range crds {
		obj := crd.DeepCopy()
		obj.SetResourceVersion("")
		if _, err := res.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
			return fmt.Errorf("applying CustomResourceDefinition %s: %w", obj.GetName(), err)
		}
		logger.Info("Applied CustomResourceDefinition", "name", obj.GetName())
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, crd := range crds {
		for {
			got, err := res.Get(ctx, crd.GetName(), metav1.GetOptions{})
			if err == nil && established(got) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("CustomResourceDefinition %s not Established after %s (last read: %v)", crd.GetName(), timeout, err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

func established(u *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" {
			return strings.EqualFold(fmt.Sprint(m["status"]), "True")
		}
	}
	return false
}
