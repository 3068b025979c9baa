package quotaschedule

import (
	"archive/zip"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// zoneProbe is the instant the zone tests read offsets at: summer time in
// both New York (-04:00) and Berlin (+02:00).
var zoneProbe = time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)

// TestZonesIgnoreMachineDatabase shows a window's zone comes from the pinned
// database alone: a child process whose ZONEINFO points at a database that
// lies (New York and Berlin are UTC there) or at nothing still reads the
// true offsets. Go reads ZONEINFO once per process, hence the child.
func TestZonesIgnoreMachineDatabase(t *testing.T) {
	if os.Getenv("TESSERA_TZ_CHILD") == "1" {
		for _, z := range []string{"America/New_York", "Europe/Berlin"} {
			w, err := Parse(Spec{Start: "09:00", End: "17:00", TimeZone: z})
			if err != nil {
				t.Fatal(err)
			}
			_, off := zoneProbe.In(w.loc).Zone()
			fmt.Printf("%s=%d\n", z, off)
		}
		return
	}
	liar := filepath.Join(t.TempDir(), "liar.zip")
	writeLyingDB(t, liar, "America/New_York", "Europe/Berlin")
	const want = "America/New_York=-14400\nEurope/Berlin=7200\n"
	for _, zi := range []string{liar, "/nonexistent/zoneinfo.zip"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestZonesIgnoreMachineDatabase$")
		cmd.Env = append(os.Environ(), "TESSERA_TZ_CHILD=1", "ZONEINFO="+zi, "TZ=UTC")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("ZONEINFO=%s: child failed: %v\n%s", zi, err, out)
		}
		got := strings.TrimSuffix(string(out), "PASS\n")
		if got != want {
			t.Errorf("ZONEINFO=%s: offsets\n%s\nwant\n%s", zi, got, want)
		}
	}
}

// writeLyingDB writes a zone database at path in which each of names holds
// UTC's rules.
func writeLyingDB(t *testing.T, path string, names ...string) {
	t.Helper()
	utc := embeddedZone(t, "Etc/UTC")
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, n := range names {
		w, err := zw.CreateHeader(&zip.FileHeader{Name: n, Method: zip.Store})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(utc); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func embeddedZone(t *testing.T, name string) []byte {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(tzZip), int64(len(tzZip)))
	if err != nil {
		t.Fatal(err)
	}
	f, err := zr.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPinnedRelease keeps TZRelease and tzdb/README.md naming the same
// release, and an unknown zone's error naming it.
func TestPinnedRelease(t *testing.T) {
	readme, err := os.ReadFile("tzdb/README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "release **"+TZRelease+"**") {
		t.Errorf("tzdb/README.md does not name release %s", TZRelease)
	}
	if _, err := zoneFromDB("Nowhere/Atlantis"); err == nil || !strings.Contains(err.Error(), TZRelease) {
		t.Errorf("unknown zone: error %v, want one naming release %s", err, TZRelease)
	}
}
