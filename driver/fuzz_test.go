package driver

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
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
		`{"version":1,"claims":{"u":{"uid":"u","state":"prepared","time":"0000-01-01T00:00:00+01:00"}}}`} {
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
	})
}
