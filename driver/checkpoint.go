package driver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/tessera-gpu/tessera/internal/killpoint"
)

// CheckpointVersion is the version of the checkpoint format this build
// writes. Newer minor changes only add fields (which older builds keep and
// ignore); a change older builds cannot read bumps this number, and then an
// older build refuses the file instead of guessing.
const CheckpointVersion = 1

// CheckpointFile is the checkpoint's name in the plugin data directory.
const CheckpointFile = "checkpoint.json"

// Claim states in the checkpoint.
const (
	// StatePreparing is written before anything is done for a claim, so a
	// crash leaves a record of what may be half-done (and of the GPU
	// memory it holds).
	StatePreparing = "preparing"
	// StatePrepared is written once the sharing setup and CDI spec exist.
	StatePrepared = "prepared"
)

// ErrCheckpointCorrupt and ErrCheckpointVersion are wrapped by LoadCheckpoint's
// errors so callers (and the recovery flag) can tell them apart.
var (
	ErrCheckpointCorrupt = errors.New("checkpoint is corrupt")
	ErrCheckpointVersion = errors.New("checkpoint was written by a newer tessera-node")
)

// Checkpoint is the node's durable record of prepared claims and
// device-plugin allocations: the one ledger of the node's GPU capacity.
type Checkpoint struct {
	Version int `json:"version"`
	// BootID is the node's boot ID when the file was written; a different
	// one at start means the node rebooted, so the CDI specs (on tmpfs) and
	// MPS daemons are gone and must be recreated.
	BootID string `json:"bootID"`
	// Claims by UID.
	Claims map[string]*ClaimCheckpoint `json:"claims"`
	// DevicePlugin holds the device-plugin allocations by pod UID: the same
	// ledger as the claims, so neither path hands out capacity the other
	// holds. Added without a version bump: older builds keep the field
	// unknown and write it back (but do not account it).
	DevicePlugin map[string]*PodCheckpoint `json:"devicePlugin,omitempty"`

	// unknown holds fields of a newer build of the same version, written
	// back unchanged so a downgrade-upgrade cycle loses nothing.
	unknown map[string]json.RawMessage
}

// ClaimCheckpoint is one claim's record.
type ClaimCheckpoint struct {
	UID       string             `json:"uid"`
	Namespace string             `json:"namespace"`
	Name      string             `json:"name"`
	State     string             `json:"state"`
	Devices   []DeviceCheckpoint `json:"devices"`
	// PreparedAt is when the claim reached its current state.
	Time time.Time `json:"time"`

	unknown map[string]json.RawMessage
}

// PodCheckpoint is one device-plugin allocation: a pod that got whole GPUs
// or a share of one through an extended resource. Its devices are recorded
// like a claim's (Request is the resource name, Pool the node, Strategy
// Exclusive for whole GPUs), so the ledger checks treat both paths alike.
type PodCheckpoint struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Resource is the extended resource (nvidia.com/gpu, tessera.dev/gpu-share).
	Resource string `json:"resource"`
	State    string `json:"state"`
	// DeviceIDs are the kubelet's device IDs of the allocation (GPU UUIDs or
	// share slots): what the kubelet accounts.
	DeviceIDs []string           `json:"deviceIDs,omitempty"`
	Devices   []DeviceCheckpoint `json:"devices"`
	Time      time.Time          `json:"time"`

	unknown map[string]json.RawMessage
}

// DeviceCheckpoint is one allocated GPU of a claim request.
type DeviceCheckpoint struct {
	Request     string `json:"request"`
	Pool        string `json:"pool"`
	Device      string `json:"device"`
	GPUUUID     string `json:"gpuUUID"`
	MemoryBytes uint64 `json:"memoryBytes"`
	// Strategy is the sharing mode; Config the final, merged GpuConfig.
	Strategy    string          `json:"strategy"`
	Config      json.RawMessage `json:"config,omitempty"`
	ShareID     string          `json:"shareID,omitempty"`
	AdminAccess bool            `json:"adminAccess,omitempty"`
	CDIDeviceID string          `json:"cdiDeviceID,omitempty"`
}

// NewCheckpoint returns an empty checkpoint for this boot.
func NewCheckpoint(bootID string) *Checkpoint {
	return &Checkpoint{Version: CheckpointVersion, BootID: bootID, Claims: map[string]*ClaimCheckpoint{}, DevicePlugin: map[string]*PodCheckpoint{}}
}

var checkpointFields = []string{"version", "bootID", "claims", "devicePlugin"}
var claimFields = []string{"uid", "namespace", "name", "state", "devices", "time"}
var podFields = []string{"uid", "namespace", "name", "resource", "state", "deviceIDs", "devices", "time"}

// UnmarshalJSON decodes known fields and keeps the others.
func (p *PodCheckpoint) UnmarshalJSON(data []byte) error {
	type plain PodCheckpoint
	if err := json.Unmarshal(data, (*plain)(p)); err != nil {
		return err
	}
	u, err := unknownFields(data, podFields)
	p.unknown = u
	return err
}

// MarshalJSON writes known fields and the kept unknown ones.
func (p *PodCheckpoint) MarshalJSON() ([]byte, error) {
	type plain PodCheckpoint
	return withUnknown((*plain)(p), p.unknown)
}

// UnmarshalJSON decodes known fields and keeps the others.
func (c *Checkpoint) UnmarshalJSON(data []byte) error {
	type plain Checkpoint
	if err := json.Unmarshal(data, (*plain)(c)); err != nil {
		return err
	}
	u, err := unknownFields(data, checkpointFields)
	c.unknown = u
	return err
}

// MarshalJSON writes known fields and the kept unknown ones.
func (c *Checkpoint) MarshalJSON() ([]byte, error) {
	type plain Checkpoint
	return withUnknown((*plain)(c), c.unknown)
}

// UnmarshalJSON decodes known fields and keeps the others.
func (c *ClaimCheckpoint) UnmarshalJSON(data []byte) error {
	type plain ClaimCheckpoint
	if err := json.Unmarshal(data, (*plain)(c)); err != nil {
		return err
	}
	u, err := unknownFields(data, claimFields)
	c.unknown = u
	return err
}

// MarshalJSON writes known fields and the kept unknown ones.
func (c *ClaimCheckpoint) MarshalJSON() ([]byte, error) {
	type plain ClaimCheckpoint
	return withUnknown((*plain)(c), c.unknown)
}

func unknownFields(data []byte, known []string) (map[string]json.RawMessage, error) {
	var all map[string]json.RawMessage
	if err := json.Unmarshal(data, &all); err != nil {
		return nil, err
	}
	// encoding/json reads a key into a field whatever its case ("bootId"
	// into bootID), so such a key is not unknown: kept, it would be written
	// back next to the field and override it on the next load.
	for k := range all {
		for _, f := range known {
			if strings.EqualFold(k, f) {
				delete(all, k)
				break
			}
		}
	}
	if len(all) == 0 {
		return nil, nil
	}
	return all, nil
}

func withUnknown(v any, unknown map[string]json.RawMessage) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil || len(unknown) == 0 {
		return data, err
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(data, &all); err != nil {
		return nil, err
	}
	for k, raw := range unknown {
		if _, known := all[k]; !known {
			all[k] = raw
		}
	}
	return json.Marshal(all)
}

// DecodeCheckpoint parses a checkpoint file's content.
func DecodeCheckpoint(data []byte) (*Checkpoint, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("%w: file is empty", ErrCheckpointCorrupt)
	}
	// The version first, so that a newer format that does not parse as
	// ours reports the version and not a confusing decode error.
	var head struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCheckpointCorrupt, err)
	}
	if head.Version == nil {
		return nil, fmt.Errorf("%w: no version field", ErrCheckpointCorrupt)
	}
	if *head.Version > CheckpointVersion {
		return nil, fmt.Errorf("%w: version %d, this build reads up to %d", ErrCheckpointVersion, *head.Version, CheckpointVersion)
	}
	if *head.Version < 1 {
		return nil, fmt.Errorf("%w: invalid version %d", ErrCheckpointCorrupt, *head.Version)
	}
	var c Checkpoint
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCheckpointCorrupt, err)
	}
	if c.Claims == nil {
		c.Claims = map[string]*ClaimCheckpoint{}
	}
	for uid, cl := range c.Claims {
		if cl == nil || cl.UID != uid {
			return nil, fmt.Errorf("%w: claim entry %q does not match its UID", ErrCheckpointCorrupt, uid)
		}
		if cl.State != StatePreparing && cl.State != StatePrepared {
			return nil, fmt.Errorf("%w: claim %s has unknown state %q", ErrCheckpointCorrupt, uid, cl.State)
		}
	}
	for uid, p := range c.DevicePlugin {
		if p == nil || p.UID != uid {
			return nil, fmt.Errorf("%w: device-plugin entry %q does not match its pod UID", ErrCheckpointCorrupt, uid)
		}
		if p.State != StatePreparing && p.State != StatePrepared {
			return nil, fmt.Errorf("%w: device-plugin pod %s has unknown state %q", ErrCheckpointCorrupt, uid, p.State)
		}
	}
	if c.DevicePlugin == nil {
		c.DevicePlugin = map[string]*PodCheckpoint{}
	}
	c.Version = CheckpointVersion
	return &c, nil
}

// Encode serializes the checkpoint (indented: people read it when
// something goes wrong).
func (c *Checkpoint) Encode() ([]byte, error) {
	return json.MarshalIndent(c, "", "  ")
}

// SortedClaims returns the claims in UID order.
func (c *Checkpoint) SortedClaims() []*ClaimCheckpoint {
	out := make([]*ClaimCheckpoint, 0, len(c.Claims))
	for _, cl := range c.Claims {
		out = append(out, cl)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UID < out[j].UID })
	return out
}

// SortedPods returns the device-plugin allocations in pod UID order.
func (c *Checkpoint) SortedPods() []*PodCheckpoint {
	out := make([]*PodCheckpoint, 0, len(c.DevicePlugin))
	for _, p := range c.DevicePlugin {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UID < out[j].UID })
	return out
}

// checkpointStore reads and atomically writes the checkpoint file.
type checkpointStore struct {
	path string
}

// Load reads the checkpoint; a missing file gives an empty one.
func (s checkpointStore) Load(bootID string) (*Checkpoint, error) {
	data, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return NewCheckpoint(bootID), nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading checkpoint %s: %w", s.path, err)
	}
	c, err := DecodeCheckpoint(data)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", s.path, err)
	}
	return c, nil
}

// Save writes c atomically: a temp file in the same directory, fsync,
// rename, fsync of the directory. A crash leaves the old or the new file,
// never a mix.
func (s checkpointStore) Save(c *Checkpoint) error {
	data, err := c.Encode()
	if err != nil {
		return fmt.Errorf("encoding checkpoint: %w", err)
	}
	dir := filepath.Dir(s.path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("creating checkpoint directory: %w", err)
	}
	tmp, err := os.CreateTemp(dir, s.tempPrefix()+"*")
	if err != nil {
		return fmt.Errorf("writing checkpoint: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing checkpoint: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("syncing checkpoint: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing checkpoint: %w", err)
	}
	killpoint.Reach(killpoint.CheckpointRename)
	if err := os.Rename(tmp.Name(), s.path); err != nil {
		return fmt.Errorf("replacing checkpoint: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// tempPrefix starts the name of every temp file Save creates.
func (s checkpointStore) tempPrefix() string { return "." + filepath.Base(s.path) + ".tmp-" }

// RemoveTemps deletes the temp files of writes that never reached their
// rename: a process killed mid-write leaves one each time (Save removes its
// own on any error it returns). Only one tessera-node runs per plugin
// directory (it holds the directory's lock, see lockDir) and callers hold
// d.mu, so no write is in flight. It returns the names it removed.
func (s checkpointStore) RemoveTemps() ([]string, error) {
	dir := filepath.Dir(s.path)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s for checkpoint temp files: %w", dir, err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if e.IsDir() || !strings.HasPrefix(e.Name(), s.tempPrefix()) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing checkpoint temp file: %w", err))
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
}

// MoveAside renames an unreadable checkpoint to <name>.bad-<time> so the
// node can start fresh; the old file stays for a person to inspect.
func (s checkpointStore) MoveAside(now time.Time) (string, error) {
	dest := s.path + ".bad-" + now.UTC().Format("20060102T150405Z")
	if err := os.Rename(s.path, dest); err != nil {
		return "", fmt.Errorf("moving checkpoint aside: %w", err)
	}
	return dest, nil
}

// ReadBootID returns the kernel's boot ID.
func ReadBootID(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading boot ID: %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}
