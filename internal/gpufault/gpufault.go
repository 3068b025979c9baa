// Package gpufault lets an end-to-end test make fake GPUs unhealthy from
// outside tessera-node, at the moment the test chooses.
//
// Test only. It is inert unless tessera-node's environment names a file in
// Env, and tessera-node refuses Env without --fake-gpus, so it can never
// touch real GPUs. The file lists the indexes of the GPUs that are to be
// unhealthy now; tessera-node polls it and raises a critical XID on each GPU
// that joins the list (as NVML would report a double-bit ECC error) and
// resets each GPU that leaves it (gpu.Fake's InjectXID and Recover). The
// health then travels the production path: the driver's health tracking,
// the ResourceSlice's unhealthy taint, the device plugin's ListAndWatch to
// the kubelet. test/e2e/realnode uses it to make the real kubelet choose
// other GPUs than tessera-controller assigned (driver/README.md, "Test
// fault file").
package gpufault

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// Env names the fault file. Test only: never set it elsewhere.
const Env = "TESSERA_TEST_GPU_FAULT_FILE"

// XID is the error raised on a GPU that joins the list: 48, a double-bit ECC
// error, critical (the GPU stays unhealthy until reset).
const XID = 48

// PollInterval is how often Watch reads the file.
const PollInterval = 100 * time.Millisecond

// maxFileSize bounds what Watch reads: a list of indexes is short.
const maxFileSize = 64 << 10

// Injector raises and clears faults on GPUs by index: gpu.Fake.
type Injector interface {
	InjectXID(index int, xid uint64) error
	Recover(index int) error
}

// Parse reads the fault file's content: GPU indexes separated by commas,
// spaces or newlines; a line's text after '#' is a comment; empty means
// every GPU healthy. Each index must be below gpus and appear once. The
// result is sorted.
func Parse(data string, gpus int) ([]int, error) {
	var out []int
	for n, line := range strings.Split(data, "\n") {
		line, _, _ = strings.Cut(line, "#")
		for f := range strings.FieldsFuncSeq(line, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\r' }) {
			i, err := strconv.Atoi(f)
			switch {
			case err != nil || i < 0:
				return nil, fmt.Errorf("%s line %d: %q is not a GPU index (a non-negative integer)", Env, n+1, f)
			case i >= gpus:
				return nil, fmt.Errorf("%s line %d: GPU index %d out of range: the node has %d GPUs (0..%d)", Env, n+1, i, gpus, gpus-1)
			case slices.Contains(out, i):
				return nil, fmt.Errorf("%s line %d: GPU index %d listed twice", Env, n+1, i)
			}
			out = append(out, i)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Watch polls the file at path every PollInterval until ctx ends and makes
// the GPUs it lists unhealthy (inj.InjectXID with XID) and those it no
// longer lists healthy again (inj.Recover). A missing file lists none. A
// file that does not parse is logged and changes nothing: the faults stay
// as they were until a valid list replaces it.
func Watch(ctx context.Context, path string, gpus int, inj Injector) {
	logger := klog.FromContext(ctx).WithValues("file", path)
	var current []int
	lastErr := ""
	t := time.NewTicker(PollInterval)
	defer t.Stop()
	for {
		want, err := read(path, gpus)
		if err != nil {
			if err.Error() != lastErr {
				logger.Error(err, "Test GPU fault file ignored; faults unchanged", "unhealthy", current)
			}
			lastErr = err.Error()
		} else {
			lastErr = ""
			current = apply(logger, inj, current, want)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func read(path string, gpus int) ([]int, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the test GPU fault file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading the test GPU fault file: %w", err)
	}
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("%s: the file is over %d bytes", Env, maxFileSize)
	}
	return Parse(string(data), gpus)
}

// apply moves the faults from current to want and returns what now holds:
// a GPU whose injection failed keeps its old state and is tried again at
// the next poll.
func apply(logger klog.Logger, inj Injector, current, want []int) []int {
	now := slices.Clone(current)
	for _, i := range want {
		if slices.Contains(current, i) {
			continue
		}
		if err := inj.InjectXID(i, XID); err != nil {
			logger.Error(err, "Test GPU fault: raising an XID", "gpu", i)
			continue
		}
		logger.Info("Test GPU fault: GPU made unhealthy", "gpu", i, "xid", XID)
		now = append(now, i)
	}
	for _, i := range current {
		if slices.Contains(want, i) {
			continue
		}
		if err := inj.Recover(i); err != nil {
			logger.Error(err, "Test GPU fault: resetting the GPU", "gpu", i)
			continue
		}
		logger.Info("Test GPU fault: GPU reset", "gpu", i)
		now = slices.DeleteFunc(now, func(g int) bool { return g == i })
	}
	slices.Sort(now)
	return now
}
