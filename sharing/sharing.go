// Package sharing enforces how a GPU is shared once a claim is prepared on
// it: nothing for Exclusive, the time-slice interval for TimeSlicing, and a
// supervised MPS control daemon per GPU (with the GPU in EXCLUSIVE_PROCESS
// compute mode) for MPS.
//
// The driver's checkpoint is the durable record of which claims are
// prepared; after a restart the driver calls Prepare again for each of
// them (Prepare is idempotent) to rebuild this package's state.
package sharing

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api/config/v1alpha1"
	"github.com/tessera-gpu/tessera/gpu"
)

// ErrModeConflict is wrapped by the error for a claim whose sharing mode
// differs from the mode of the claims already on the GPU.
var ErrModeConflict = errors.New("GPU already shared in another mode")

// ModeConflictError says which GPU is held in which mode.
type ModeConflictError struct {
	GPU       string
	Current   v1alpha1.SharingStrategy
	Requested v1alpha1.SharingStrategy
	Claims    int
}

func (e *ModeConflictError) Error() string {
	return fmt.Sprintf("GPU %s is prepared for %d claim(s) in sharing mode %s; a %s claim cannot share it (one sharing mode per GPU at a time)",
		e.GPU, e.Claims, e.Current, e.Requested)
}

func (e *ModeConflictError) Unwrap() error { return ErrModeConflict }

// CheckMode is the rule for mixing: a GPU holds claims of one sharing mode
// at a time. current is "" when the GPU holds no claim. The driver applies
// it against its own ledger before it prepares anything.
func CheckMode(gpuUUID string, current, requested v1alpha1.SharingStrategy, claims int) error {
	if current == "" || claims == 0 || current == requested {
		return nil
	}
	return &ModeConflictError{GPU: gpuUUID, Current: current, Requested: requested, Claims: claims}
}

// Prepared is what a prepared (claim, GPU) needs in its CDI spec.
type Prepared struct {
	Strategy v1alpha1.SharingStrategy
	// MPSPipeDir is the host pipe directory of the GPU's MPS daemon (MPS only).
	MPSPipeDir string
}

// Manager enforces sharing per GPU and keeps, in memory, which claims hold
// each GPU in which mode.
type Manager struct {
	inv gpu.Inventory
	mps *MPSManager

	mu   sync.Mutex
	gpus map[string]*gpuState
}

type gpuState struct {
	mode   v1alpha1.SharingStrategy
	claims map[string]v1alpha1.TimeSliceInterval
}

// NewManager returns a Manager. mps may be nil on nodes that do not offer
// MPS; MPS claims then fail with a clear error.
func NewManager(inv gpu.Inventory, mps *MPSManager) *Manager {
	return &Manager{inv: inv, mps: mps, gpus: map[string]*gpuState{}}
}

// MPS returns the MPS manager (nil when MPS is off), e.g. for metrics.
func (m *Manager) MPS() *MPSManager { return m.mps }

// MPSDaemons is the number of running MPS daemons, for the metrics.
func (m *Manager) MPSDaemons() int {
	if m.mps == nil {
		return 0
	}
	return m.mps.Daemons()
}

// Mode returns the sharing mode of a GPU and how many claims hold it; ""
// and 0 when none does.
func (m *Manager) Mode(gpuUUID string) (v1alpha1.SharingStrategy, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.gpus[gpuUUID]; ok {
		return s.mode, len(s.claims)
	}
	return "", 0
}

// Prepare enforces cfg for one claim on one GPU. It is idempotent per
// (claim, GPU), and refuses a mode other than the one the GPU is held in.
func (m *Manager) Prepare(ctx context.Context, claimUID, gpuUUID string, cfg *v1alpha1.GpuConfig) (Prepared, error) {
	strategy := cfg.Strategy()
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.gpus[gpuUUID]
	if s != nil {
		if err := CheckMode(gpuUUID, s.mode, strategy, len(s.claims)); err != nil {
			return Prepared{}, err
		}
	}
	out := Prepared{Strategy: strategy}
	switch strategy {
	case v1alpha1.Exclusive:
	case v1alpha1.TimeSlicing:
		iv := cfg.Interval()
		if s != nil {
			if old, ok := s.claims[claimUID]; ok && old == iv {
				return out, nil
			}
			for other, oiv := range s.claims {
				if other != claimUID && oiv != iv {
					// The interval is per GPU: the newest claim's wins.
					klog.FromContext(ctx).Info("Time-slice interval changed by a newer claim", "gpu", gpuUUID, "from", oiv, "to", iv, "claim", claimUID)
					break
				}
			}
		}
		if err := m.inv.SetTimeSlice(gpuUUID, gpu.TimeSliceInterval(iv)); err != nil {
			return Prepared{}, fmt.Errorf("time-slicing GPU %s: setting interval %s: %w", gpuUUID, iv, err)
		}
	case v1alpha1.MPS:
		if m.mps == nil {
			return Prepared{}, fmt.Errorf("MPS on GPU %s: MPS is not enabled on this node", gpuUUID)
		}
		d, err := m.mps.Acquire(ctx, claimUID, gpuUUID)
		if err != nil {
			return Prepared{}, err
		}
		out.MPSPipeDir = d.PipeDir
	default:
		return Prepared{}, fmt.Errorf("GPU %s: unknown sharing strategy %q", gpuUUID, strategy)
	}
	if s == nil {
		s = &gpuState{mode: strategy, claims: map[string]v1alpha1.TimeSliceInterval{}}
		m.gpus[gpuUUID] = s
	}
	s.claims[claimUID] = cfg.Interval()
	return out, nil
}

// Unprepare undoes Prepare for one claim on one GPU: with the GPU's last
// claim, MPS stops its daemon and time-slicing restores the Default
// interval. Unknown claims are a no-op.
func (m *Manager) Unprepare(ctx context.Context, claimUID, gpuUUID string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.gpus[gpuUUID]
	if !ok {
		return nil
	}
	if _, ok := s.claims[claimUID]; !ok {
		return nil
	}
	switch s.mode {
	case v1alpha1.MPS:
		if err := m.mps.Release(ctx, claimUID, gpuUUID); err != nil {
			return err
		}
	case v1alpha1.TimeSlicing:
		if len(s.claims) == 1 {
			if err := m.inv.SetTimeSlice(gpuUUID, gpu.TimeSliceDefault); err != nil {
				return fmt.Errorf("time-slicing GPU %s: restoring interval Default: %w", gpuUUID, err)
			}
		}
	}
	delete(s.claims, claimUID)
	if len(s.claims) == 0 {
		delete(m.gpus, gpuUUID)
	}
	return nil
}
