package controlplane

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"k8s.io/klog/v2"
)

// EnvBinDir names the directory holding prebuilt control-plane binaries.
// `make test` sets it, so the build script runs once per `make test`
// instead of once per test binary.
const EnvBinDir = "TESSERA_BIN_DIR"

const modulePath = "github.com/tessera-gpu/tessera"

// requiredBinaries are what Start and StartKwok run.
var requiredBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}

// shortSkipReason is shared by every entry point that needs the binaries.
const shortSkipReason = "needs a real control plane (etcd, kube-apiserver, kube-controller-manager built by hack/build-controlplane.sh); skipped with -short"

var (
	buildOnce sync.Once
	builtDir  string
	buildErr  error
)

// BinDir returns the directory of the control-plane binaries: $TESSERA_BIN_DIR
// when set, else the output of hack/build-controlplane.sh (which builds them
// on first use; its progress goes to stderr). It skips the test under -short
// and fails it when the binaries cannot be found or built.
func BinDir(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip(shortSkipReason)
	}
	dir, err := FindBinDir()
	if err != nil {
		t.Fatalf("control-plane binaries: %v", err)
	}
	return dir
}

// FindBinDir is BinDir without a testing.TB, for use from TestMain.
func FindBinDir() (string, error) {
	if dir := os.Getenv(EnvBinDir); dir != "" {
		return dir, checkBinaries(dir)
	}
	buildOnce.Do(func() {
		builtDir, buildErr = runBuildScript()
		if buildErr == nil {
			buildErr = checkBinaries(builtDir)
		}
	})
	return builtDir, buildErr
}

func checkBinaries(dir string) error {
	var missing []string
	for _, b := range requiredBinaries {
		if st, err := os.Stat(filepath.Join(dir, b)); err != nil || st.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s lacks %s (build them with hack/build-controlplane.sh, or unset %s)",
			dir, strings.Join(missing, ", "), EnvBinDir)
	}
	return nil
}

// Binary returns the path of one binary hack/build-controlplane.sh builds
// on request only (kubectl, for the kept demo): in $TESSERA_BIN_DIR when it
// is there, else built by the script (once, cached by version).
func Binary(name string) (string, error) {
	if dir := os.Getenv(EnvBinDir); dir != "" {
		if st, err := os.Stat(filepath.Join(dir, name)); err == nil && st.Mode()&0o111 != 0 {
			return filepath.Join(dir, name), nil
		}
	}
	dir, err := runBuildScript(name)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, name), nil
}

func runBuildScript(names ...string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	script := filepath.Join(root, "hack", "build-controlplane.sh")
	klog.InfoS("Building control-plane binaries (cold builds take minutes; set "+EnvBinDir+" to skip)", "script", script, "binaries", names)
	cmd := exec.Command(script, names...)
	cmd.Dir = root
	cmd.Stderr = os.Stderr // progress of a long build must be visible
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("running %s: %w", script, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1]), nil
}

// repoRoot finds the module root by walking up from the working directory
// (go test runs in the package directory), falling back to this source
// file's location.
func repoRoot() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		starts = append(starts, filepath.Dir(file))
	}
	for _, dir := range starts {
		for d := dir; ; d = filepath.Dir(d) {
			if data, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil &&
				bytes.Contains(data, []byte("module "+modulePath+"\n")) {
				return d, nil
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	return "", fmt.Errorf("cannot find the root of module %s above %v; set %s", modulePath, starts, EnvBinDir)
}
