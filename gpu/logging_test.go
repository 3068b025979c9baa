package gpu

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// bufferLogger is a logger whose lines the test can read back.
func bufferLogger(t *testing.T) (klog.Logger, func() string) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true), ktesting.Verbosity(2)))
	return logger, func() string { return logger.GetSink().(ktesting.Underlier).GetBuffer().String() }
}

// TestLogsAreContextual: Health logs to its context's logger and Devices to
// the inventory's (WithLogger), with the GPU as a key, never to klog's
// global logger.
func TestLogsAreContextual(t *testing.T) {
	invLogger, invLogs := bufferLogger(t)
	ctxLogger, ctxLogs := bufferLogger(t)
	f, err := NewFake("h100-sxm-8", "node-a", WithHealthProbeInterval(20*time.Millisecond), WithLogger(invLogger))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), ctxLogger))
	defer cancel()
	ch := f.Health(ctx)

	require.NoError(t, f.InjectXID(2, 48))
	assert.False(t, nextEvent(t, ch).Healthy)
	require.NoError(t, f.InjectXID(3, 13)) // application XID: logged at V(2)
	require.NoError(t, f.Remove(5))
	assert.Equal(t, 5, nextEvent(t, ch).Index)
	_, err = f.Devices()
	require.NoError(t, err)
	cancel()
	for range ch {
	}

	assert.Contains(t, ctxLogs(), `INFO GPU is unhealthy gpu=2 uuid="`+FakeUUID("node-a", 2)+`" reason="`)
	assert.Contains(t, ctxLogs(), `INFO Health: application XID; the GPU stays healthy gpu=3 xid=13`)
	assert.Contains(t, ctxLogs(), `INFO GPU is unhealthy gpu=5 `)
	assert.Contains(t, invLogs(), `INFO Skipping a lost GPU gpu=5 err="`)
	assert.NotContains(t, invLogs(), "GPU is unhealthy")
	assert.NotContains(t, ctxLogs(), "Skipping a lost GPU")
}
