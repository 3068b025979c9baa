package realnode

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Pod network of the bridge CNI config. Nothing outside the node routes to
// it; pods only need an address and a loopback.
const podSubnet = "10.244.0.0/24"

type paths struct {
	socket, root, state, cdi, cniConf, cniData, kubeletConfig string
}

// containerdConfig is containerd 2.x's config (version 3). Each setting
// below was needed on these machines; see docs/REAL-NODE.md.
func containerdConfig(p paths) string {
	return fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
# NRI would listen on a fixed host path; the node does not use it.
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = %[3]q

[plugins."io.containerd.cri.v1.runtime"]
  # The VM lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj.
  restrict_oom_score_adj = true
  # tessera-node writes its CDI specs here; CDI is always on in 2.x.
  cdi_spec_dirs = [%[4]q]
  # Network namespaces under our state dir, so teardown finds them.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = %[5]q
        # cgroup v1 with the cgroupfs driver, like the kubelet.
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%[6]q]
    conf_dir = %[7]q

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %[8]q
`, p.root, p.state, p.socket, p.cdi, runcPath, cniBinDir, p.cniConf, PauseImage)
}

// cniConfig is a bridge + host-local network: without a CNI config the node
// stays NotReady, even for hostNetwork pods. No masquerading, so no
// iptables rules to clean up.
func cniConfig(p paths) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "tessera-realnode",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "loopback"}
  ]
}
`, bridgeName, p.cniData, podSubnet)
}

// kubeletConfig is the KubeletConfiguration. Each non-default setting is
// needed here; see docs/REAL-NODE.md.
func kubeletConfig(p paths, nodeIP, clientCA string, gates map[string]bool) string {
	var fg strings.Builder
	if len(gates) > 0 {
		fg.WriteString("featureGates:\n")
		for _, k := range slices.Sorted(maps.Keys(gates)) {
			fmt.Fprintf(&fg, "  %s: %s\n", k, strconv.FormatBool(gates[k]))
		}
	}
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The apiserver reaches the kubelet (logs, exec) on the node IP.
address: %[1]s
readOnlyPort: 0
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    # The apiserver presents a client cert from the harness CA.
    clientCAFile: %[2]q
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://%[3]s
# cgroup v1 machines: kubelet 1.36 refuses them unless told otherwise.
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
# runc cannot lower oom_score_adj here (no CAP_SYS_RESOURCE).
oomScoreAdj: 0
# Imported images cannot be pulled again: never garbage-collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# A shared test machine's disk and memory must not evict test pods.
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
resolvConf: /etc/resolv.conf
nodeStatusUpdateFrequency: 2s
syncFrequency: 5s
registerNode: true
serializeImagePulls: false
%[4]s`, nodeIP, clientCA, p.socket, fg.String())
}
