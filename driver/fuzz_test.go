package driver

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// FuzzDecodeCheckpoint feeds DecodeCheckpoint what it reads from the node's
// disk after a crash, a downgrade or a person's edit. A file is refused as
// corrupt or too new, or its checkpoint can be saved (encodes) and reads
// back to the same checkpoint: the same bytes when encoded again, the
// same claims and pods under their UIDs.
func FuzzDecodeCheckpoint(f *testing.F) {
	files, err := filepath.Glob("testdata/checkpoint*.json")
	if err != nil || len(files) == 0 {
		f.Fatalf("no testdata/checkpoint*.json seeds: %v", err)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	if b, err := sampleCheckpoint().Encode(); err == nil {
		f.Add(b)
	}
	for _, s := range []string{``, `{"version":1,"claims":{"a":`, `{"claims":{}}`, `{"version":0}`, `{"version":2,"claims":"a new format"}`,
		`{"version":1,"claims":{"u":{"uid":"v","state":"prepared"}}}`, `{"version":1,"claims":{},"devicePlugin":[1]}`,
		`{"version":1,"bootID":"b","claims":null}`, `{"version":1,"Claims":{"u":{"uid":"u","state":"prepared"}},"claims":{}}`,
		`{"version":1,"claims":{"u":{"uid":"u","state":"prepared","time":"0000-01-01T00:00:00+01:00"}}}`,
		`{"version":1,"bootId":"old","claims":{},"deviceplugin":{"p":{"uid":"p","state":"prepared"}}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := DecodeCheckpoint(data)
		if err != nil {
			if !errors.Is(err, ErrCheckpointCorrupt) && !errors.Is(err, ErrCheckpointVersion) {
				t.Fatalf("error is neither corrupt nor too new: %v", err)
			}
			return
		}
		enc, err := c.Encode()
		if err != nil {
			t.Fatalf("a checkpoint it read cannot be saved: %v", err)
		}
		back, err := DecodeCheckpoint(enc)
		if err != nil {
			t.Fatalf("its own file does not read back: %v\n%s", err, enc)
		}
		enc2, err := back.Encode()
		if err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("encoded twice differently (%v):\n%s\n%s", err, enc, enc2)
		}
		if len(back.Claims) != len(c.Claims) || len(back.DevicePlugin) != len(c.DevicePlugin) || back.BootID != c.BootID {
			t.Fatalf("read back %d claims, %d pods, boot %q; want %d, %d, %q", len(back.Claims), len(back.DevicePlugin), back.BootID, len(c.Claims), len(c.DevicePlugin), c.BootID)
		}
		for uid, cl := range c.Claims {
			if b := back.Claims[uid]; b == nil || b.UID != uid || b.State != cl.State || len(b.Devices) != len(cl.Devices) || !b.Time.Equal(cl.Time) {
				t.Fatalf("claim %s read back as %+v, want %+v", uid, b, cl)
			}
		}
		for uid, p := range c.DevicePlugin {
			if b := back.DevicePlugin[uid]; b == nil || b.UID != uid || b.State != p.State || len(b.Devices) != len(p.Devices) || !b.Time.Equal(p.Time) {
				t.Fatalf("pod %s read back as %+v, want %+v", uid, b, p)
			}
		}
		checkChangesPersist(t, back)
	})
}

// checkChangesPersist changes what the node changes in a checkpoint (the
// boot ID, its claims and pods) and checks that the saved file reads back
// with the changes: nothing kept from the old file may override them.
func checkChangesPersist(t *testing.T, c *Checkpoint) {
	t.Helper()
	c.BootID = "new-boot"
	for uid := range c.Claims {
		c.Claims[uid].State = StatePreparing
	}
	c.DevicePlugin = map[string]*PodCheckpoint{}
	enc, err := c.Encode()
	if err != nil {
		t.Fatalf("changed checkpoint cannot be saved: %v", err)
	}
	back, err := DecodeCheckpoint(enc)
	if err != nil {
		t.Fatalf("changed checkpoint does not read back: %v\n%s", err, enc)
	}
	if back.BootID != "new-boot" || len(back.DevicePlugin) != 0 || len(back.Claims) != len(c.Claims) {
		t.Fatalf("changes lost: boot %q, %d pods (want none), %d claims (want %d):\n%s", back.BootID, len(back.DevicePlugin), len(back.Claims), len(c.Claims), enc)
	}
	for uid, cl := range back.Claims {
		if cl.State != StatePreparing {
			t.Fatalf("claim %s: state %q, want %q:\n%s", uid, cl.State, StatePreparing, enc)
		}
	}
}

// A key that differs from a known field only in case is read into the
// field by encoding/json; kept as an unknown field as well, it was written
// back next to the field and, sorting after it, overrode it on the next
// load: a stale boot ID, stale device-plugin pods came back.
func TestCheckpointCaseVariantKeys(t *testing.T) {
	c, err := DecodeCheckpoint([]byte(`{"version":1,"bootId":"old","claims":{"u":{"uid":"u","state":"prepared","State":"prepared"}},"deviceplugin":{"p":{"uid":"p","state":"prepared"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.BootID != "old" || len(c.DevicePlugin) != 1 {
		t.Fatalf("read boot %q and %d pods; want the case variants read as the fields", c.BootID, len(c.DevicePlugin))
	}
	checkChangesPersist(t, c)
}

// FuzzSemverVersion feeds SemverVersion the NVIDIA driver and CUDA versions
// NVML reports (or a fake profile's driverVersion says). An accepted
// version is MAJOR.MINOR.PATCH without leading zeros, and normalizing it
// again changes nothing.
func FuzzSemverVersion(f *testing.F) {
	for _, s := range []string{"550.54.15", "535.104.05", "9.0", "12", " 12.4 ", "1.2.3.4", "", ".", "1..2", "-1", "4294967296", "007.08"} {
		f.Add(s)
	}
	semver := regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)
	f.Fuzz(func(t *testing.T, v string) {
		out, err := SemverVersion(v)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "version "+strconv.Quote(v)+": ") {
				t.Fatalf("error does not quote the version: %v", err)
			}
			return
		}
		if !semver.MatchString(out) {
			t.Fatalf("%q normalized to %q, not semantic versioning", v, out)
		}
		if again, err := SemverVersion(out); err != nil || again != out {
			t.Fatalf("%q normalized to %q, then to %q, %v", v, out, again, err)
		}
	})
}

// FuzzDeviceIndex feeds deviceIndex the device names of allocation
// results read from the API: a name it takes for ours is exactly the
// DeviceName of its index.
func FuzzDeviceIndex(f *testing.F) {
	for _, s := range []string{"gpu-0", "gpu-7", "gpu-07", "gpu--1", "gpu-", "gpu-+1", "gpu-9223372036854775808", "share-0", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		i := deviceIndex(name)
		if i < -1 || (i >= 0 && DeviceName(i) != name) {
			t.Fatalf("deviceIndex(%q) = %d", name, i)
		}
		if n := atoiOr(strings.TrimPrefix(name, "gpu-")); i == -1 && n >= 0 && DeviceName(n) == name {
			t.Fatalf("deviceIndex(%q) = -1, but it is the name of GPU %d", name, n)
		}
	})
}

func atoiOr(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return -1
	}
	return n
}
