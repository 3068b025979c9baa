// Package scenario reads tessera-sim scenario files (see SCENARIOS.md), runs
// them through the scheduling core cycle by cycle, and checks and reports what
// happened. Files are strict: an unknown field, a bad value or a reference to
// something that does not exist is an error that names the file, the scenario,
// the field and why — never a silent default.
package scenario

import (
	"encoding/json"
	"fmt"
)

// The types in this file mirror the YAML exactly; pointers mark fields whose
// absence means "use the default", which differs from the zero value.

type fileScenario struct {
	Name   string `json:"name"`
	Cycles *int   `json:"cycles"`
	// Time makes the run timed (SCENARIOS.md, "Time"): cycle length, run
	// length, and the fairness report's sampling.
	Time   *fileTime   `json:"time"`
	Config *fileConfig `json:"config"`
	Nodes  []fileNode  `json:"nodes"`
	// Topologies are the network layouts jobs may ask to be kept within
	// (core.Topology).
	Topologies []fileTopology `json:"topologies"`
	Queues     []fileQueue    `json:"queues"`
	Jobs       []fileJob      `json:"jobs"`
	Expect     *fileExpect    `json:"expect"`
}

type fileTime struct {
	Cycle    string `json:"cycle"`
	Duration string `json:"duration"`
	Sample   string `json:"sample"`
	// Start is the wall-clock time the run starts at (RFC 3339), which
	// quota schedules read.
	Start string `json:"start"`
}

type fileConfig struct {
	Consolidation *bool  `json:"consolidation"`
	Placement     string `json:"placement"`
	// Usage turns fair share with history on (timed runs only).
	Usage *fileUsage `json:"usage"`
}

type fileUsage struct {
	HalfLife    string    `json:"halfLife"`
	Window      string    `json:"window"`
	Bucket      string    `json:"bucket"`
	Coefficient *Quantity `json:"coefficient"`
}

type fileNode struct {
	Name      string            `json:"name"`
	Count     *int              `json:"count"`
	GPUs      *int              `json:"gpus"`
	GPUMemory *Quantity         `json:"gpuMemory"`
	GPUModel  string            `json:"gpuModel"`
	NVLink    string            `json:"nvlink"`
	CPU       *Quantity         `json:"cpu"`
	Memory    *Quantity         `json:"memory"`
	Labels    map[string]string `json:"labels"`
}

type fileQueue struct {
	Name     string        `json:"name"`
	Parent   string        `json:"parent"`
	Priority *int          `json:"priority"`
	GPU      *fileResource `json:"gpu"`
	CPU      *fileResource `json:"cpu"`
	Memory   *fileResource `json:"memory"`
	// Time protections (core.Queue), durations; unset inherits the parent's.
	PreemptMinRuntime string `json:"preemptMinRuntime"`
	ReclaimMinRuntime string `json:"reclaimMinRuntime"`
	PreemptionDelay   string `json:"preemptionDelay"`
	// Schedule: windows overriding the settings while they hold.
	Schedule []fileWindow `json:"schedule"`
}

type fileWindow struct {
	Days     []string      `json:"days"`
	Start    string        `json:"start"`
	End      string        `json:"end"`
	TimeZone string        `json:"timeZone"`
	GPU      *fileResource `json:"gpu"`
	CPU      *fileResource `json:"cpu"`
	Memory   *fileResource `json:"memory"`
}

type fileResource struct {
	Quota           *Quantity `json:"quota"`
	Limit           *Quantity `json:"limit"`
	OverQuotaWeight *Quantity `json:"overQuotaWeight"`
}

type fileJob struct {
	Name        string `json:"name"`
	Queue       string `json:"queue"`
	Priority    *int   `json:"priority"`
	Preemptible *bool  `json:"preemptible"`
	// PreemptionPolicy is an extension of SCENARIOS.md: Kubernetes'
	// PreemptLowerPriority (default) or Never.
	PreemptionPolicy string `json:"preemptionPolicy"`
	// Disruption is an extension of SCENARIOS.md: Kubernetes' PodGroup
	// disruptionMode, single or all (core.Job.Disruption); unset is
	// Tessera's gang rule.
	Disruption string `json:"disruption"`
	MinMember  *int   `json:"minMember"`
	// SubGroups: parts of the gang with minimums of their own
	// (core.Job.SubGroups); pods name theirs in subGroup.
	SubGroups []fileSubGroup `json:"subGroups"`
	// Topology keeps the gang in one domain of a level
	// (core.Job.Topology).
	Topology  *fileTopologyConstraint `json:"topology"`
	CreatedAt *Quantity               `json:"createdAt"`
	// ArriveAt, RunFor and Repeat need a timed run (time:): when the job
	// appears, how long its gang runs before it finishes, and copies of it
	// arriving at intervals.
	ArriveAt string      `json:"arriveAt"`
	RunFor   string      `json:"runFor"`
	Repeat   *fileRepeat `json:"repeat"`
	Pods     []filePod   `json:"pods"`
}

type fileRepeat struct {
	Count *int   `json:"count"`
	Every string `json:"every"`
}

type fileSubGroup struct {
	Name      string                  `json:"name"`
	MinMember *int                    `json:"minMember"`
	Topology  *fileTopologyConstraint `json:"topology"`
}

type fileTopology struct {
	Name   string   `json:"name"`
	Levels []string `json:"levels"`
}

type fileTopologyConstraint struct {
	Name      string `json:"name"`
	Required  string `json:"required"`
	Preferred string `json:"preferred"`
}

type filePod struct {
	Count *int `json:"count"`
	// SubGroup names one of the job's subGroups.
	SubGroup string `json:"subGroup"`
	fileGPU
	CPU     *Quantity    `json:"cpu"`
	Memory  *Quantity    `json:"memory"`
	Running *fileRunning `json:"running"`
	// Alternatives is an extension of SCENARIOS.md: GPU requests tried in
	// order when the pod's own fits no node (Kubernetes' DRA prioritized
	// list, firstAvailable; core.Pod.Alternatives).
	Alternatives []fileGPU `json:"alternatives"`
}

// fileGPU is the GPU fields of a pod set: the pod's own request, embedded in
// filePod, or one of its alternatives, which takes these fields and no other.
type fileGPU struct {
	GPU       *Quantity `json:"gpu"`
	GPUMemory *Quantity `json:"gpuMemory"`
	Sharing   string    `json:"sharing"`
	NVLink    string    `json:"nvlink"`
}

type fileRunning struct {
	Node string `json:"node"`
	GPUs []int  `json:"gpus"`
}

type fileExpect struct {
	Jobs   map[string]fileExpectJob   `json:"jobs"`
	Pods   map[string]fileExpectPod   `json:"pods"`
	Queues map[string]fileExpectQueue `json:"queues"`
}

type fileExpectJob struct {
	Running *int `json:"running"`
	Pending *int `json:"pending"`
	Evicted *int `json:"evicted"`
}

type fileExpectPod struct {
	Node *string `json:"node"`
	GPUs *[]int  `json:"gpus"`
	// State and Reason go beyond SCENARIOS.md's example: they let a scenario
	// pin a pod's state and the words of its why-pending reason (a substring).
	State  string  `json:"state"`
	Reason *string `json:"reason"`
	// GPUMemory is the GPU memory the pod holds, as the report prints it.
	GPUMemory *Quantity `json:"gpuMemory"`
}

type fileExpectQueue struct {
	GPUFairShare *Quantity `json:"gpuFairShare"`
	GPUAllocated *Quantity `json:"gpuAllocated"`
	// GPUQuota is the queue's GPU quota as the report prints it (-1:
	// unlimited), so a file can check the default a queue got.
	GPUQuota *Quantity `json:"gpuQuota"`
}

// Quantity keeps a number or a string exactly as written, so that parsing,
// which depends on the unit of the field, can happen during validation with an
// error naming the field.
type Quantity struct {
	raw string
}

// UnmarshalJSON accepts a JSON number or string.
func (q *Quantity) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		q.raw = s
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("want a number or a string, got %s", b)
	}
	q.raw = n.String()
	return nil
}

// String returns the value as written.
func (q *Quantity) String() string { return q.raw }
