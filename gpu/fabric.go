package gpu

// Multi-node NVLink (a GB200 NVL72 rack): GPUs of several nodes on one
// NVLink fabric. NVML's fabric info names the fabric (cluster UUID) and the
// partition of it the GPU belongs to (clique ID); GPUs that agree on both
// can talk over NVLink across nodes. NVIDIA's GPU feature discovery labels
// nodes nvidia.com/gpu.clique with the same "<cluster UUID>.<clique ID>".

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/uuid"
)

// readClique is the GPU's multi-node NVLink clique, "" when it has none:
// fabric info not supported (no multi-node NVLink, an older driver), its
// registration not complete, or no cluster. Only a lost GPU is an error:
// anything else leaves the GPU without a clique rather than without a
// place in the inventory.
func readClique(h nvml.Device) (string, error) {
	info, ret := h.GetGpuFabricInfo()
	switch {
	case ret == nvml.ERROR_GPU_IS_LOST:
		return "", nvmlErr("reading fabric info", ret)
	case ret != nvml.SUCCESS:
		return "", nil
	case info.State != nvml.GPU_FABRIC_STATE_COMPLETED || nvml.Return(info.Status) != nvml.SUCCESS:
		return "", nil
	case info.ClusterUuid == [16]uint8{}:
		return "", nil
	}
	return FormatClique(uuid.UUID(info.ClusterUuid), info.CliqueId), nil
}

// FormatClique is a clique as the node label and device attribute carry
// it: "<cluster UUID>.<clique ID>".
func FormatClique(cluster uuid.UUID, clique uint32) string {
	return cluster.String() + "." + strconv.FormatUint(uint64(clique), 10)
}

// ParseClique reads "<cluster UUID>.<clique ID>" (FormatClique's form),
// with errors naming what is wrong.
func ParseClique(s string) (uuid.UUID, uint32, error) {
	i := strings.LastIndexByte(s, '.')
	if i < 0 {
		return uuid.UUID{}, 0, fmt.Errorf("clique %q is not <cluster UUID>.<clique ID>", s)
	}
	cluster, err := uuid.Parse(s[:i])
	if err != nil || len(s[:i]) != 36 {
		return uuid.UUID{}, 0, fmt.Errorf("clique %q: cluster UUID %q is not a UUID like 6e3b0c1e-2c0a-4f4e-9d0a-5b1c2d3e4f50", s, s[:i])
	}
	if cluster == (uuid.UUID{}) {
		return uuid.UUID{}, 0, fmt.Errorf("clique %q: the cluster UUID is all zeros, which NVML reports for no cluster", s)
	}
	id, err := strconv.ParseUint(s[i+1:], 10, 32)
	if err != nil {
		return uuid.UUID{}, 0, fmt.Errorf("clique %q: clique ID %q is not a whole number from 0 to %d", s, s[i+1:], uint32(1<<32-1))
	}
	return cluster, uint32(id), nil
}

// FakeClusterUUID is the NVLink cluster of fake profiles that give only a
// clique ID (gb200-nvl72 with --fake-clique=N): one fabric for the test.
var FakeClusterUUID = uuid.MustParse("7e55e7a0-0000-4000-8000-00000000a172")

// cliqueInput reads a fake clique given as "<cluster UUID>.<clique ID>" or
// a clique ID alone (on FakeClusterUUID).
func cliqueInput(s string) (string, error) {
	if id, err := strconv.ParseUint(s, 10, 32); err == nil {
		return FormatClique(FakeClusterUUID, uint32(id)), nil
	}
	cluster, id, err := ParseClique(s)
	if err != nil {
		return "", err
	}
	return FormatClique(cluster, id), nil
}
