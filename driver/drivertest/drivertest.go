// Package drivertest has helpers for tests of the DRA plugin: a stand-in
// for nvidia-cuda-mps-control that records what it was asked, and builders
// for allocated ResourceClaims.
package drivertest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	gpuconfig "github.com/tessera-gpu/tessera/api/config/v1alpha1"
	"github.com/tessera-gpu/tessera/internal/draname"
	"github.com/tessera-gpu/tessera/sharing"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"
)

// RecordEnv names the file the stand-in appends its log to; tessera-node's
// built-in stand-in (fake mode) appends to the same file, in the same form.
const RecordEnv = sharing.StandInRecordEnv

// standIn behaves like the MPS control program as far as tessera-node sees
// it: `-d` starts a daemon (here a sleep in its own session) and writes its
// pid file in CUDA_MPS_PIPE_DIRECTORY; without -d it reads a command from
// stdin, and `quit` stops the daemon. Every call is recorded, and every
// daemon's pid goes to <record>.pids, so a test can find a daemon nobody
// tracks any more (an orphan) by its pid.
const standIn = `#!/bin/sh
log="${` + RecordEnv + `:-/dev/null}"
if [ "$1" = "-d" ]; then
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  sleep 100000 </dev/null >/dev/null 2>&1 &
  echo $! > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
  echo "$CUDA_VISIBLE_DEVICES $!" >> "$log.pids"
  echo "start $CUDA_VISIBLE_DEVICES" >> "$log"
  exit 0
fi
read cmd
echo "$cmd $CUDA_VISIBLE_DEVICES" >> "$log"
if [ "$cmd" = "quit" ]; then
  kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid")" 2>/dev/null
fi
exit 0
`

// ShortTempDir is a temporary directory with a short path (t.TempDir has the
// test's name in it): Unix socket paths, the DRA plugin's and the MPS
// daemon's below an MPS root, must stay within 107 characters.
func ShortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// MPSStandIn writes the stand-in as dir/nvidia-cuda-mps-control and returns
// its path and the record file it appends to (through RecordEnv). Daemons
// still running when the test ends are killed.
func MPSStandIn(t testing.TB, dir string) (control, record string) {
	t.Helper()
	control = filepath.Join(dir, "nvidia-cuda-mps-control")
	record = filepath.Join(dir, "mps-record.log")
	if err := os.WriteFile(control, []byte(standIn), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { KillDaemons(t, record) })
	return control, record
}

// Record returns the stand-in's recorded calls, one per line ("start UUID",
// "quit UUID").
func Record(t testing.TB, record string) []string {
	t.Helper()
	data, err := os.ReadFile(record)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(strings.ReplaceAll(strings.TrimSpace(string(data)), " ", "_"))
}

// Daemons returns the pids of every daemon the stand-in started that is
// still running, by GPU UUID (a zombie counts as gone).
func Daemons(t testing.TB, record string) map[string][]int {
	t.Helper()
	data, err := os.ReadFile(record + ".pids")
	if os.IsNotExist(err) {
		return map[string][]int{}
	}
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		uuid, pidText, ok := strings.Cut(line, " ")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil {
			t.Fatalf("stand-in pid record %q", line)
		}
		if running(pid) {
			out[uuid] = append(out[uuid], pid)
		}
	}
	return out
}

// KillDaemons kills every daemon the stand-in started (a reboot, or the end
// of a test).
func KillDaemons(t testing.TB, record string) {
	t.Helper()
	for _, pids := range Daemons(t, record) {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func running(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

// Result is one allocated device; memory "" means no consumed capacity (a
// whole GPU).
func Result(request, pool, device, memory string) resourceapi.DeviceRequestAllocationResult {
	r := resourceapi.DeviceRequestAllocationResult{Request: request, Driver: draname.Driver, Pool: pool, Device: device}
	if memory != "" {
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{draname.CapacityMemory: resource.MustParse(memory)}
		r.ShareID = ptr.To(uuid.NewUUID())
	}
	return r
}

// Config is an opaque GpuConfig entry from the class or the claim.
func Config(source resourceapi.AllocationConfigSource, params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{
		Source:   source,
		Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: draname.Driver, Parameters: runtime.RawExtension{Raw: []byte(params)},
		}},
	}
}

// Strategy is the class config of a sharing strategy.
func Strategy(strategy string) resourceapi.DeviceAllocationConfiguration {
	b, _ := json.Marshal(map[string]any{
		"apiVersion": gpuconfig.APIVersion, "kind": gpuconfig.Kind,
		"sharing": map[string]any{"strategy": strategy},
	})
	return Config(resourceapi.AllocationConfigSourceClass, string(b))
}

// Claim is an allocated claim.
func Claim(namespace, name, uid string, results []resourceapi.DeviceRequestAllocationResult, configs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(uid)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: results, Config: configs},
		}},
	}
}
