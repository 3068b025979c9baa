package node

import (
	"testing"

	"github.com/tessera-gpu/tessera/driver/drivertest"
	"github.com/tessera-gpu/tessera/sharing"
)

func mpsStandIn(t testing.TB, dir string) (string, string) {
	return drivertest.MPSStandIn(t, dir)
}

func mpsOptions(e *nodeEnv) *sharing.MPSOptions {
	return &sharing.MPSOptions{Control: e.control, Root: e.mpsRoot, Env: []string{drivertest.RecordEnv + "=" + e.record}}
}
