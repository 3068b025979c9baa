package framework

import (
	"fmt"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/deviceplugin"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/assignment"
)

// FakeGPUNode is the kwok Node of a GPU node whose tessera-node runs with
// --fake-gpus=profile: room for many pods, and the device-plugin resources
// (whole GPUs and share slots) a kubelet would report for tessera-node's
// device plugin, since kwok has no kubelet to do it.
func FakeGPUNode(name, profile string, labels map[string]string) (*corev1.Node, error) {
	inv, err := gpu.NewFake(profile, name)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	devs, err := inv.Devices()
	if err != nil {
		return nil, fmt.Errorf("node %s: fake GPUs of %s: %w", name, profile, err)
	}
	n := int64(len(devs))
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: corev1.NodeStatus{Capacity: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("96"), corev1.ResourceMemory: resource.MustParse("1Ti"), corev1.ResourcePods: resource.MustParse("110"),
			// A kubelet reports its disk; MPIJob's launcher asks for 5Gi of it.
			corev1.ResourceEphemeralStorage: resource.MustParse("2Ti"),
			assignment.DefaultResourceGPU:   *resource.NewQuantity(n, resource.DecimalSI),
			assignment.ResourceShare:        *resource.NewQuantity(n*deviceplugin.DefaultShareSlots, resource.DecimalSI),
		}},
	}, nil
}

// FakeTesseraNodeArgs is the command line of tessera-node for a kwok node
// with fake GPUs, its files under dir. Without a kubelet there are no
// device plugins to serve (several fake nodes would also share the default
// device-plugin directory) and no HTTP endpoint to probe.
func FakeTesseraNodeArgs(name, profile, kubeconfig, dir string) []string {
	return []string{
		"--node-name=" + name,
		"--kubeconfig=" + kubeconfig,
		"--fake-gpus=" + profile,
		"--kubelet-plugin-dir=" + filepath.Join(dir, "plugin"),
		"--kubelet-registrar-dir=" + filepath.Join(dir, "registry"),
		"--cdi-root=" + filepath.Join(dir, "cdi"),
		"--mps-root=" + filepath.Join(dir, "mps"),
		"--http-address=",
		"--device-plugin=false",
	}
}
