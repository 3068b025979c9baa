package main

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/controller/kube"
)

// setQueue applies one --set: queue/NAME.RES.FIELD=VALUE.
func setQueue(d *kube.Dump, spec string) error {
	lhs, value, ok := strings.Cut(spec, "=")
	path, found := strings.CutPrefix(lhs, "queue/")
	parts := strings.Split(path, ".")
	if !ok || !found || len(parts) != 3 {
		return fmt.Errorf("--set %q: want queue/NAME.RES.FIELD=VALUE, as queue/team-a.gpu.quota=16", spec)
	}
	name, res, field := parts[0], parts[1], parts[2]
	if res != "gpu" && res != "cpu" && res != "memory" {
		return fmt.Errorf("--set %q: resource %q is not gpu, cpu or memory", spec, res)
	}
	var v any
	switch field {
	case "quota", "limit":
		if _, err := resource.ParseQuantity(value); err != nil {
			return fmt.Errorf("--set %q: %s %q: %w", spec, field, value, err)
		}
		v = value
	case "overQuotaWeight":
		w, err := strconv.ParseInt(value, 10, 32)
		if err != nil || w < 0 {
			return fmt.Errorf("--set %q: overQuotaWeight %q is not a whole number of at least 0", spec, value)
		}
		v = w
	default:
		return fmt.Errorf("--set %q: field %q is not quota, limit or overQuotaWeight", spec, field)
	}
	for _, q := range d.Objects.Queues {
		u := unstructured.Unstructured{Object: q}
		if u.GetName() == name {
			return unstructured.SetNestedField(q, v, "spec", "resources", res, field)
		}
	}
	return fmt.Errorf("--set %q: the snapshot has no Queue %q", spec, name)
}

// addNodes applies one --add-nodes NODE:N: N copies of the node and of its
// ResourceSlices (devices, pools and names renamed), without its pods.
func addNodes(d *kube.Dump, spec string) error {
	name, count, ok := strings.Cut(spec, ":")
	n, err := strconv.Atoi(count)
	if !ok || err != nil || n < 1 || n > 10000 {
		return fmt.Errorf("--add-nodes %q: want NODE:N with N from 1 to 10000, as h100-node-1:4", spec)
	}
	o := &d.Objects
	src := -1
	for i := range o.Nodes {
		if o.Nodes[i].Name == name {
			src = i
		}
	}
	if src < 0 {
		return fmt.Errorf("--add-nodes %q: the snapshot has no node %q", spec, name)
	}
	for i := 1; i <= n; i++ {
		clone := fmt.Sprintf("%s-whatif-%d", name, i)
		nd := *o.Nodes[src].DeepCopy()
		nd.Name, nd.UID, nd.ResourceVersion = clone, types.UID("whatif-"+clone), ""
		if nd.Labels["kubernetes.io/hostname"] != "" {
			nd.Labels["kubernetes.io/hostname"] = clone
		}
		o.Nodes = append(o.Nodes, nd)
		for _, sl := range o.ResourceSlices {
			if sl.Spec.NodeName == nil || *sl.Spec.NodeName != name {
				continue
			}
			c := *sl.DeepCopy()
			c.Name, c.UID = strings.Replace(c.Name, name, clone, 1)+"-whatif", ""
			c.Spec.NodeName = &clone
			if c.Spec.Pool.Name == name {
				c.Spec.Pool.Name = clone
			} else {
				c.Spec.Pool.Name += "-" + clone
			}
			o.ResourceSlices = append(o.ResourceSlices, c)
		}
	}
	return nil
}
