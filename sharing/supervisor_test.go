package sharing

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startSupervisor serves a supervisor over its real socket in h's MPS root,
// running h's stand-in; cancel stops it (and its daemons).
func startSupervisor(t *testing.T, h *harness) (socket string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Supervisor{Root: h.root, Runner: &ProcessRunner{Control: DefaultMPSControl, Timeout: 5 * time.Second, Env: h.opts.Env}}
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ctx) }()
	socket = filepath.Join(h.root, SupervisorSocket)
	require.Eventually(t, func() bool { _, err := os.Stat(socket); return err == nil }, 10*time.Second, 10*time.Millisecond)
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-errc
	}
	t.Cleanup(func() { _ = stop() })
	return socket, stop
}

// TestSupervisorRunsDaemons: through the supervisor's socket, a manager
// starts one daemon per GPU, a second manager (tessera-node restarted)
// adopts it, a killed daemon is started again and counted, the last release
// stops it, and stopping the supervisor stops the daemons left (uninstall).
func TestSupervisorRunsDaemons(t *testing.T) {
	h := newHarness(t)
	socket, stop := startSupervisor(t, h)
	opts := h.opts
	opts.Supervisor = socket
	ctx := context.Background()

	m := NewMPSManager(h.inv, opts)
	d, err := m.Acquire(ctx, "claim-a", gpu0)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(h.root, gpu0, "pipe"), d.PipeDir)
	require.True(t, alive(d.PID))

	// tessera-node restarted: a new manager adopts the daemon.
	m2 := NewMPSManager(h.inv, opts)
	d2, err := m2.Acquire(ctx, "claim-a", gpu0)
	require.NoError(t, err)
	assert.Equal(t, d.PID, d2.PID, "adopted, not started again")
	assert.Len(t, h.starts(t), 1)

	// The daemon dies: the check loop starts it again and counts it.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go m2.Supervise(sctx)
	require.NoError(t, syscall.Kill(d.PID, syscall.SIGKILL))
	require.Eventually(t, func() bool {
		nd, ok := m2.Daemon(gpu0)
		return ok && nd.PID != d.PID && alive(nd.PID) && m2.Restarts() == 1
	}, 10*time.Second, 20*time.Millisecond)
	cancel()

	// The last release stops it.
	restarted, _ := m2.Daemon(gpu0)
	require.NoError(t, m2.Release(ctx, "claim-a", gpu0))
	assert.False(t, alive(restarted.PID), "stopped with the last claim")
	assert.Len(t, h.lines(t, "stdin pipe="+filepath.Join(h.root, gpu0, "pipe")+" line=quit"), 1)

	// A daemon still running when the supervisor stops is stopped too.
	d3, err := m2.Acquire(ctx, "claim-b", gpu1)
	require.NoError(t, err)
	require.NoError(t, stop())
	assert.False(t, alive(d3.PID), "no daemon outlives the supervisor's shutdown")
	// Nor its directories or socket (uninstall leaves no garbage).
	_, err = os.Stat(h.root)
	assert.True(t, os.IsNotExist(err), "MPS root %s removed: %v", h.root, err)
	_, err = m2.Acquire(ctx, "claim-c", gpu0)
	require.ErrorContains(t, err, "is the tessera-mps pod running on this node?")
}

// TestSupervisorRefusesBadRequests: bad calls get a clear error and start
// nothing, and a root that differs from tessera-node's is named.
func TestSupervisorRefusesBadRequests(t *testing.T) {
	h := newHarness(t)
	socket, _ := startSupervisor(t, h)
	c := NewSupervisorClient(socket, h.root, time.Second)
	for _, tc := range []struct{ body, want string }{
		{`{"gpu":"../etc"}`, `only letters, digits and '-'`},
		{`{"gpu":""}`, "empty GPU UUID"},
		{`{"gpu":"GPU-1","extra":1}`, "unknown field"},
		{`{"gpu":"GPU-1","pid":-4}`, "negative pid"},
		{`{"gpu":"GPU-1"} {}`, "data after the JSON object"},
		{`not json`, "invalid character"},
	} {
		resp, err := c.http.Post("http://mps-supervisor/v1/start", "application/json", strings.NewReader(tc.body))
		require.NoError(t, err)
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, tc.body)
		assert.Contains(t, string(out), tc.want, tc.body)
	}
	assert.Empty(t, h.starts(t), "nothing started")

	other := NewSupervisorClient(socket, "/elsewhere", time.Second)
	_, err := other.Start(context.Background(), DaemonSpec{GPU: gpu0, PipeDir: "/elsewhere/" + gpu0 + "/pipe"})
	require.ErrorContains(t, err, "give both the same --mps-root")
}

func FuzzDecodeSupervisorRequest(f *testing.F) {
	for _, s := range []string{`{"gpu":"GPU-1"}`, `{"gpu":"GPU-1","pid":7}`, `{"gpu":"a/b"}`, `{}`, `[]`, ``} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		req, err := DecodeSupervisorRequest(strings.NewReader(body))
		if err != nil {
			return
		}
		// What passes names a directory right below the root, no more.
		require.NoError(t, ValidateGPU(req.GPU))
		require.Equal(t, req.GPU, filepath.Base(req.GPU))
		require.NotContains(t, []string{".", ".."}, req.GPU)
		require.GreaterOrEqual(t, req.PID, 0)
	})
}

// TestRemoveDaemonDirs: stopped daemons' directories and the socket go, a
// running daemon's directory and what is not MPS's stay.
func TestRemoveDaemonDirs(t *testing.T) {
	root := t.TempDir()
	mk := func(rel, content string) {
		p := filepath.Join(root, rel)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	mk("GPU-stopped/pipe/"+PIDFile, "999999999")
	mk("GPU-stopped/log/control.log", "x")
	mk("GPU-running/pipe/"+PIDFile, strconv.Itoa(os.Getpid()))
	mk(SupervisorSocket, "")
	mk("not_a_gpu/x", "")
	err := RemoveDaemonDirs(root)
	require.ErrorContains(t, err, "GPU-running still runs")
	ents, rerr := os.ReadDir(root)
	require.NoError(t, rerr)
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	assert.Equal(t, []string{"GPU-running", "not_a_gpu"}, left)
	require.NoError(t, RemoveDaemonDirs(filepath.Join(root, "absent")))
}
