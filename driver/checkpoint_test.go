package driver

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sampleCheckpoint() *Checkpoint {
	c := NewCheckpoint("boot-1")
	c.Claims["uid-1"] = &ClaimCheckpoint{
		UID: "uid-1", Namespace: "ns", Name: "c1", State: StatePrepared, Time: time.Unix(1700000000, 0).UTC(),
		Devices: []DeviceCheckpoint{{Request: "gpu", Pool: "node-a", Device: "gpu-0", GPUUUID: "GPU-0",
			MemoryBytes: 40 << 30, Strategy: "MPS", Config: json.RawMessage(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS"}}`),
			ShareID: "share-1", CDIDeviceID: "gpu.tessera.dev/claim=uid-1_gpu_GPU-0"}},
	}
	return c
}

func TestCheckpointRoundTrip(t *testing.T) {
	c := sampleCheckpoint()
	data, err := c.Encode()
	require.NoError(t, err)
	got, err := DecodeCheckpoint(data)
	require.NoError(t, err)
	want, gotDevs := c.Claims["uid-1"].Devices, got.Claims["uid-1"].Devices
	require.Len(t, gotDevs, 1)
	assert.JSONEq(t, string(want[0].Config), string(gotDevs[0].Config))
	w, g := want[0], gotDevs[0]
	w.Config, g.Config = nil, nil
	assert.Equal(t, w, g)
	assert.Equal(t, c.Claims["uid-1"].Time, got.Claims["uid-1"].Time)
	assert.Equal(t, "boot-1", got.BootID)
	assert.Equal(t, CheckpointVersion, got.Version)
}

func TestDecodeCheckpoint(t *testing.T) {
	for _, tc := range []struct {
		name    string
		data    string
		wantErr error
		check   func(t *testing.T, c *Checkpoint)
	}{
		{name: "empty file", data: "", wantErr: ErrCheckpointCorrupt},
		{name: "truncated", data: `{"version":1,"claims":{"a":`, wantErr: ErrCheckpointCorrupt},
		{name: "garbage", data: "\x00\x01garbage", wantErr: ErrCheckpointCorrupt},
		{name: "no version", data: `{"claims":{}}`, wantErr: ErrCheckpointCorrupt},
		{name: "version zero", data: `{"version":0}`, wantErr: ErrCheckpointCorrupt},
		{name: "future version", data: `{"version":2,"claims":"a new format"}`, wantErr: ErrCheckpointVersion},
		{name: "bad state", data: `{"version":1,"claims":{"u":{"uid":"u","state":"frobnicated"}}}`, wantErr: ErrCheckpointCorrupt},
		{name: "uid mismatch", data: `{"version":1,"claims":{"u":{"uid":"v","state":"prepared"}}}`, wantErr: ErrCheckpointCorrupt},
		{name: "device-plugin bad state", data: `{"version":1,"claims":{},"devicePlugin":{"p":{"uid":"p","state":"gone"}}}`, wantErr: ErrCheckpointCorrupt},
		{name: "device-plugin uid mismatch", data: `{"version":1,"claims":{},"devicePlugin":{"p":{"uid":"q","state":"prepared"}}}`, wantErr: ErrCheckpointCorrupt},
		{name: "device-plugin not an object", data: `{"version":1,"claims":{},"devicePlugin":[1]}`, wantErr: ErrCheckpointCorrupt},
		{name: "device-plugin entries and their unknown fields", data: `{"version":1,"bootID":"b","claims":{},"devicePlugin":{"p":{"uid":"p","namespace":"ns","name":"n","resource":"nvidia.com/gpu","state":"prepared","deviceIDs":["GPU-1"],"devices":[{"device":"gpu-1","gpuUUID":"GPU-1","strategy":"Exclusive"}],"later":"keep me"}}}`,
			check: func(t *testing.T, c *Checkpoint) {
				require.Contains(t, c.DevicePlugin, "p")
				p := c.DevicePlugin["p"]
				assert.Equal(t, "nvidia.com/gpu", p.Resource)
				assert.Equal(t, []string{"GPU-1"}, p.DeviceIDs)
				require.Len(t, p.Devices, 1)
				assert.Equal(t, "GPU-1", p.Devices[0].GPUUUID)
				out, err := c.Encode()
				require.NoError(t, err)
				var m map[string]any
				require.NoError(t, json.Unmarshal(out, &m))
				assert.Equal(t, "keep me", m["devicePlugin"].(map[string]any)["p"].(map[string]any)["later"])
			}},
		{name: "an older file has no device-plugin entries", data: `{"version":1,"bootID":"b","claims":{}}`, check: func(t *testing.T, c *Checkpoint) {
			assert.NotNil(t, c.DevicePlugin)
			out, err := c.Encode()
			require.NoError(t, err)
			assert.NotContains(t, string(out), "devicePlugin", "nothing added to a file without entries")
		}},
		{name: "null claims", data: `{"version":1,"bootID":"b","claims":null}`, check: func(t *testing.T, c *Checkpoint) {
			assert.NotNil(t, c.Claims)
		}},
		{
			name: "unknown fields of a newer build are kept",
			data: `{"version":1,"bootID":"b","future":{"x":1},"claims":{"u":{"uid":"u","state":"prepared","devices":[],"extra":"keep me"}}}`,
			check: func(t *testing.T, c *Checkpoint) {
				out, err := c.Encode()
				require.NoError(t, err)
				var m map[string]any
				require.NoError(t, json.Unmarshal(out, &m))
				assert.Equal(t, map[string]any{"x": float64(1)}, m["future"])
				assert.Equal(t, "keep me", m["claims"].(map[string]any)["u"].(map[string]any)["extra"])
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := DecodeCheckpoint([]byte(tc.data))
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			if tc.check != nil {
				tc.check(t, c)
			}
		})
	}
}

func TestCheckpointStore(t *testing.T) {
	dir := t.TempDir()
	s := checkpointStore{path: filepath.Join(dir, CheckpointFile)}

	c, err := s.Load("boot-1")
	require.NoError(t, err, "a missing file is an empty checkpoint")
	assert.Empty(t, c.Claims)

	require.NoError(t, s.Save(sampleCheckpoint()))
	got, err := s.Load("boot-2")
	require.NoError(t, err)
	assert.Equal(t, "boot-1", got.BootID, "the stored boot ID is what was written")
	assert.Contains(t, got.Claims, "uid-1")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temp files left behind")

	require.NoError(t, os.WriteFile(s.path, []byte("{not json"), 0o600))
	_, err = s.Load("boot-1")
	require.ErrorIs(t, err, ErrCheckpointCorrupt)
	assert.Contains(t, err.Error(), s.path)

	moved, err := s.MoveAside(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	require.NoError(t, err)
	assert.Equal(t, s.path+".bad-20260102T030405Z", moved)
	_, err = os.Stat(s.path)
	assert.True(t, os.IsNotExist(err))
}

func TestReadBootID(t *testing.T) {
	p := filepath.Join(t.TempDir(), "boot_id")
	require.NoError(t, os.WriteFile(p, []byte("abc-123\n"), 0o600))
	id, err := ReadBootID(p)
	require.NoError(t, err)
	assert.Equal(t, "abc-123", id)
	_, err = ReadBootID(filepath.Join(t.TempDir(), "missing"))
	require.Error(t, err)
}
