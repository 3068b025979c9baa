package killpoint

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		spec, point string
		nth         int
		wantErr     string
	}{
		{spec: "checkpoint-rename", point: CheckpointRename, nth: 1},
		{spec: "checkpoint-rename#2", point: CheckpointRename, nth: 2},
		{spec: "cdi-spec-write#1", point: CDISpecWrite, nth: 1},
		{spec: "checkpoint-rename#0", wantErr: "positive integer"},
		{spec: "checkpoint-rename#x", wantErr: "positive integer"},
		{spec: "rename", wantErr: `unknown kill point "rename"`},
		{spec: "", wantErr: "unknown kill point"},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			point, nth, err := Parse(tc.spec)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				assert.Contains(t, err.Error(), Env)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.point, point)
			assert.Equal(t, tc.nth, nth)
		})
	}
}

// TestOnNth: the hook fires on the nth time its point is reached, once,
// and Reach without a hook does nothing.
func TestOnNth(t *testing.T) {
	Reach(CheckpointRename) // no hook: nothing happens
	var died []string
	Set(OnNth(CheckpointRename, 2, func(p string) { died = append(died, p) }))
	t.Cleanup(func() { Set(nil) })
	Reach(CDISpecWrite)
	Reach(CheckpointRename)
	assert.Empty(t, died)
	Reach(CheckpointRename)
	Reach(CheckpointRename)
	assert.Equal(t, []string{CheckpointRename}, died)
}
