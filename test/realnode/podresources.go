package realnode

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// PodResourcesSocket is the kubelet's pod-resources API socket (its root is
// fixed, see README.md).
var PodResourcesSocket = filepath.Join(kubeletRoot, "pod-resources", "kubelet.sock")

// PodResources is a client of the kubelet's pod-resources API: what its
// device manager holds allocatable (registered devices reported Healthy)
// and which devices it gave each container. It answers from the kubelet's
// memory, so a test sees the kubelet's own view, not a plugin's or the API
// server's. The connection closes at t's cleanup.
func (n *Node) PodResources(t *testing.T) podresourcesv1.PodResourcesListerClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+PodResourcesSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("connecting to the kubelet's pod-resources API at %s: %v", PodResourcesSocket, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return podresourcesv1.NewPodResourcesListerClient(conn)
}

// AllocatableDevices returns the device IDs of resource that the kubelet's
// device manager holds allocatable (healthy), sorted.
func AllocatableDevices(ctx context.Context, c podresourcesv1.PodResourcesListerClient, resource string) ([]string, error) {
	resp, err := c.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("pod-resources GetAllocatableResources: %w", err)
	}
	var out []string
	for _, d := range resp.GetDevices() {
		if d.GetResourceName() == resource {
			out = append(out, d.GetDeviceIds()...)
		}
	}
	slices.Sort(out)
	return out, nil
}

// ContainerDevices returns the device IDs of resource that the kubelet gave
// the containers of pod namespace/name, sorted; none if the kubelet has not
// admitted it.
func ContainerDevices(ctx context.Context, c podresourcesv1.PodResourcesListerClient, namespace, name, resource string) ([]string, error) {
	resp, err := c.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodNamespace: namespace, PodName: name})
	if err != nil {
		return nil, fmt.Errorf("pod-resources Get %s/%s: %w", namespace, name, err)
	}
	var out []string
	for _, ctr := range resp.GetPodResources().GetContainers() {
		for _, d := range ctr.GetDevices() {
			if d.GetResourceName() == resource {
				out = append(out, d.GetDeviceIds()...)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}
