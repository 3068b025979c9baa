package gpufault

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tessera-gpu/tessera/gpu"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       []int
		wantErr    string
	}{
		{name: "empty", data: ""},
		{name: "blank lines and a comment", data: "\n  \n# nothing yet\n"},
		{name: "commas", data: "3,1", want: []int{1, 3}},
		{name: "spaces and lines", data: "0 7\n 2\t5\r\n", want: []int{0, 2, 5, 7}},
		{name: "comment after indexes", data: "4, 6 # the assigned pair\n", want: []int{4, 6}},
		{name: "empty fields", data: ",,1,,", want: []int{1}},
		{name: "out of range", data: "1\n8", wantErr: "line 2: GPU index 8 out of range: the node has 8 GPUs (0..7)"},
		{name: "negative", data: "-1", wantErr: `"-1" is not a GPU index`},
		{name: "not a number", data: "gpu-1", wantErr: `line 1: "gpu-1" is not a GPU index`},
		{name: "overflow", data: "99999999999999999999", wantErr: "is not a GPU index"},
		{name: "twice", data: "2, 2", wantErr: "GPU index 2 listed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.data, 8)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				assert.Contains(t, err.Error(), Env)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// FuzzParse: Parse never panics, and what it accepts is sorted, distinct,
// in range, and reads back the same from its canonical form.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "0", "3,1", "0 7\n 2\t5\r\n", "4, 6 # pair\n", "2,2", "8", "-1", "x", "1#2\n3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		got, err := Parse(data, 8)
		if err != nil {
			return
		}
		var parts []string
		for k, i := range got {
			if i < 0 || i >= 8 || (k > 0 && got[k-1] >= i) {
				t.Fatalf("Parse(%q) = %v: not sorted, distinct and in 0..7", data, got)
			}
			parts = append(parts, strconv.Itoa(i))
		}
		again, err := Parse(strings.Join(parts, ","), 8)
		if err != nil || !slices.Equal(again, got) {
			t.Fatalf("Parse(%q) = %v, but its canonical form reads back as %v, %v", data, got, again, err)
		}
	})
}

// TestWatch: through a fake GPU inventory's own health stream, listed GPUs
// turn unhealthy with the XID, unlisted ones healthy again, a bad file
// changes nothing, and a removed file heals all.
func TestWatch(t *testing.T) {
	fake, err := gpu.NewFake("h100-sxm-8", "node-a")
	require.NoError(t, err)
	t.Cleanup(func() { _ = fake.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	health := fake.Health(ctx)
	path := filepath.Join(t.TempDir(), "faults")
	done := make(chan struct{})
	go func() { defer close(done); Watch(ctx, path, 8, fake) }()
	t.Cleanup(func() { cancel(); <-done })

	next := func() gpu.HealthEvent {
		t.Helper()
		select {
		case e := <-health:
			return e
		case <-time.After(5 * time.Second):
			t.Fatal("no health event in 5s")
			return gpu.HealthEvent{}
		}
	}
	write := func(s string) { require.NoError(t, os.WriteFile(path, []byte(s), 0o644)) }

	write("5, 2\n")
	got := map[int]gpu.HealthEvent{}
	for range 2 {
		e := next()
		got[e.Index] = e
	}
	for _, i := range []int{2, 5} {
		assert.False(t, got[i].Healthy, "GPU %d", i)
		assert.Equal(t, uint64(XID), got[i].XID, "GPU %d", i)
	}

	write("5,x") // refused: GPU 2 stays unhealthy
	write("5")
	e := next()
	assert.Equal(t, 2, e.Index)
	assert.True(t, e.Healthy, "GPU 2 is healthy again once unlisted")

	require.NoError(t, os.Remove(path))
	e = next()
	assert.Equal(t, 5, e.Index)
	assert.True(t, e.Healthy, "GPU 5 is healthy again once the file is gone")
	select {
	case e := <-health:
		t.Errorf("unexpected health event %+v", e)
	case <-time.After(3 * PollInterval):
	}
}

// TestWatchBadFileKeepsFaults: a file that does not parse leaves the
// faults as they were, as many polls as it stays.
func TestWatchBadFileKeepsFaults(t *testing.T) {
	inj := &recorder{}
	path := filepath.Join(t.TempDir(), "faults")
	require.NoError(t, os.WriteFile(path, []byte("1"), 0o644))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); Watch(ctx, path, 4, inj) }()
	require.Eventually(t, func() bool { return inj.calls() == "xid 1" }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, os.WriteFile(path, []byte("1\n4"), 0o644)) // 4 is out of range
	time.Sleep(5 * PollInterval)
	cancel()
	<-done
	assert.Equal(t, "xid 1", inj.calls(), "an invalid file changes nothing")
}

// recorder is an Injector that records its calls.
type recorder struct {
	mu  sync.Mutex
	log []string
}

func (r *recorder) InjectXID(i int, xid uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, "xid "+strconv.Itoa(i))
	return nil
}

func (r *recorder) Recover(i int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, "recover "+strconv.Itoa(i))
	return nil
}

func (r *recorder) calls() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.log, ";")
}
