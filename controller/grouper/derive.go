package grouper

import (
	"fmt"
	"sort"
	"strconv"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// SubGroup is a part of a gang with its own minimum (a JobSet's replicated
// job replica, an LWS group's leader and workers, a Ray head and worker
// group).
type SubGroup struct {
	Name      string
	MinMember int32
}

// decision is how the pods of one group owner are grouped, as its spec says.
type decision struct {
	// alone: each pod is scheduled by itself (a Deployment's, a Job that
	// is not a gang).
	alone bool
	// suffix tells the owner's groups apart when it has several (an LWS
	// replica's group index); "" for one group per owner.
	suffix string
	// min is the gang's minimum, subGroups its parts, subGroup the pod's.
	min       int64
	subGroups []SubGroup
	subGroup  string
}

// deriveFunc reads an owner (its whole object, as the API serves it) and
// the labels of one of its pods.
type deriveFunc func(obj map[string]any, podLabels map[string]string) (decision, error)

// kindInfo is what the grouper knows of a kind of owner.
type kindInfo struct {
	resource string
	// prefix starts the names of its PodGroups ("job-llama").
	prefix string
	// derive is nil for a wrapper, whose pods' group comes from the child
	// it makes (TrainJob → JobSet, RayJob → RayCluster, CronJob → Job).
	derive deriveFunc
}

// kinds are the owners the grouper walks through and understands. An owner
// of another kind ends the walk: the group comes from the highest known one
// below it.
var kinds = map[schema.GroupKind]kindInfo{
	{Group: "", Kind: "Pod"}:                                     {resource: "pods", prefix: "pod", derive: deriveAlone},
	{Group: "apps", Kind: "ReplicaSet"}:                          {resource: "replicasets", prefix: "rs", derive: deriveAlone},
	{Group: "apps", Kind: "Deployment"}:                          {resource: "deployments", prefix: "deploy", derive: deriveAlone},
	{Group: "apps", Kind: "StatefulSet"}:                         {resource: "statefulsets", prefix: "sts", derive: deriveAlone},
	{Group: "batch", Kind: "Job"}:                                {resource: "jobs", prefix: "job", derive: deriveJob},
	{Group: "batch", Kind: "CronJob"}:                            {resource: "cronjobs", prefix: "cronjob"},
	{Group: "kubeflow.org", Kind: "PyTorchJob"}:                  {resource: "pytorchjobs", prefix: "pytorchjob", derive: deriveTraining("pytorchReplicaSpecs")},
	{Group: "kubeflow.org", Kind: "TFJob"}:                       {resource: "tfjobs", prefix: "tfjob", derive: deriveTraining("tfReplicaSpecs")},
	{Group: "kubeflow.org", Kind: "XGBoostJob"}:                  {resource: "xgboostjobs", prefix: "xgboostjob", derive: deriveTraining("xgbReplicaSpecs")},
	{Group: "kubeflow.org", Kind: "PaddleJob"}:                   {resource: "paddlejobs", prefix: "paddlejob", derive: deriveTraining("paddleReplicaSpecs")},
	{Group: "kubeflow.org", Kind: "JAXJob"}:                      {resource: "jaxjobs", prefix: "jaxjob", derive: deriveTraining("jaxReplicaSpecs")},
	{Group: "kubeflow.org", Kind: "MPIJob"}:                      {resource: "mpijobs", prefix: "mpijob", derive: deriveTraining("mpiReplicaSpecs")},
	{Group: "trainer.kubeflow.org", Kind: "TrainJob"}:            {resource: "trainjobs", prefix: "trainjob"},
	{Group: "jobset.x-k8s.io", Kind: "JobSet"}:                   {resource: "jobsets", prefix: "jobset", derive: deriveJobSet},
	{Group: "leaderworkerset.x-k8s.io", Kind: "LeaderWorkerSet"}: {resource: "leaderworkersets", prefix: "lws", derive: deriveLWS},
	{Group: "ray.io", Kind: "RayCluster"}:                        {resource: "rayclusters", prefix: "raycluster", derive: deriveRay},
	{Group: "ray.io", Kind: "RayJob"}:                            {resource: "rayjobs", prefix: "rayjob"},
	{Group: "ray.io", Kind: "RayService"}:                        {resource: "rayservices", prefix: "rayservice"},
}

// deriveAlone: one group per pod (a StatefulSet outside an LWS; a pod
// owning pods outside one). Pods of ReplicaSets (Deployments) and DaemonSets
// never wait for the grouper (kube.GroupedKinds) and are not looked at.
func deriveAlone(map[string]any, map[string]string) (decision, error) {
	return decision{alone: true}, nil
}

// deriveJob: an Indexed Job whose completions equal its parallelism is a
// gang of its parallelism (every index runs at once: a distributed
// training job); any other Job's pods run one by one. The minimum is what
// is left to run: indexes that succeeded are not run again, so a gang
// whose pods partly finished does not wait for them.
func deriveJob(obj map[string]any, _ map[string]string) (decision, error) {
	mode, err := stringField(obj, "spec", "completionMode")
	if err != nil {
		return decision{}, err
	}
	par, err := intField(obj, 1, "spec", "parallelism")
	if err != nil {
		return decision{}, err
	}
	comp, err := intField(obj, -1, "spec", "completions")
	if err != nil {
		return decision{}, err
	}
	if mode != "Indexed" || comp != par || par < 2 {
		return decision{alone: true}, nil
	}
	done, err := intField(obj, 0, "status", "succeeded")
	if err != nil {
		return decision{}, err
	}
	return decision{min: max(1, par-done)}, nil
}

// deriveTraining reads a Kubeflow training job (replica specs under key):
// runPolicy.schedulingPolicy.minAvailable when set; else, elastic, the
// elasticPolicy's minReplicas plus a Master's replicas; else the sum of
// every replica type's replicas (MPIJob: the launcher and the workers).
func deriveTraining(key string) deriveFunc {
	return func(obj map[string]any, _ map[string]string) (decision, error) {
		if n, err := intField(obj, 0, "spec", "runPolicy", "schedulingPolicy", "minAvailable"); err != nil || n > 0 {
			return decision{min: n}, err
		}
		specs, err := mapField(obj, "spec", key)
		if err != nil {
			return decision{}, err
		}
		if len(specs) == 0 {
			return decision{}, fmt.Errorf("spec.%s: no replica types", key)
		}
		names := make([]string, 0, len(specs))
		for name := range specs {
			names = append(names, name)
		}
		sort.Strings(names)
		counts := map[string]int64{}
		var all []int64
		for _, name := range names {
			rs, isMap := specs[name].(map[string]any)
			if !isMap {
				return decision{}, fmt.Errorf("spec.%s.%s is not an object", key, name)
			}
			n, err := intField(rs, 1, "replicas")
			if err != nil {
				return decision{}, fmt.Errorf("spec.%s.%s: %w", key, name, err)
			}
			counts[name] = n
			all = append(all, n)
		}
		minRep, err := intField(obj, 0, "spec", "elasticPolicy", "minReplicas")
		if err != nil {
			return decision{}, err
		}
		if minRep > 0 {
			all = []int64{minRep, counts["Master"]}
		}
		total, err := sum("spec."+key, all...)
		if err == nil && total == 0 {
			err = fmt.Errorf("spec.%s: 0 replicas in all", key)
		}
		return decision{min: total}, err
	}
}

// JobSet pod labels naming a pod's replicated job and Job index.
const (
	labelJobSetReplicatedJob = "jobset.sigs.k8s.io/replicatedjob-name"
	labelJobSetJobIndex      = "jobset.sigs.k8s.io/job-index"
)

// maxSubGroups bounds the subgroups written on one PodGroup (the CRD's
// MaxItems); a JobSet of more Jobs than this is one gang without subgroups.
const maxSubGroups = 64

// deriveJobSet: one gang of every replicated job's replicas × pods per Job
// (its parallelism, or completions when fewer), a subgroup per Job
// ("<replicated job>-<index>", each Job's pods together).
func deriveJobSet(obj map[string]any, podLabels map[string]string) (decision, error) {
	rjs, err := listField(obj, "spec", "replicatedJobs")
	if err != nil {
		return decision{}, err
	}
	if len(rjs) == 0 {
		return decision{}, fmt.Errorf("spec.replicatedJobs: none")
	}
	var d decision
	var all []int64
	for i, rj := range rjs {
		name, err := stringField(rj, "name")
		if err == nil && name == "" {
			err = fmt.Errorf("name is empty")
		}
		replicas, err2 := intField(rj, 1, "replicas")
		par, err3 := intField(rj, 1, "template", "spec", "parallelism")
		comp, err4 := intField(rj, -1, "template", "spec", "completions")
		for _, e := range []error{err, err2, err3, err4} {
			if e != nil {
				return decision{}, fmt.Errorf("spec.replicatedJobs[%d]: %w", i, e)
			}
		}
		per := par
		if comp >= 0 && comp < per {
			per = comp
		}
		if replicas*per > maxMembers {
			return decision{}, fmt.Errorf("spec.replicatedJobs[%d]: %d Jobs × %d pods is more than %d pods", i, replicas, per, maxMembers)
		}
		all = append(all, replicas*per)
		for j := int64(0); j < replicas && per > 0 && len(d.subGroups) <= maxSubGroups; j++ {
			d.subGroups = append(d.subGroups, SubGroup{Name: name + "-" + strconv.FormatInt(j, 10), MinMember: int32(per)})
		}
	}
	if d.min, err = sum("spec.replicatedJobs", all...); err != nil {
		return decision{}, err
	}
	if d.min == 0 {
		return decision{}, fmt.Errorf("spec.replicatedJobs: 0 pods in all")
	}
	if len(d.subGroups) > maxSubGroups {
		d.subGroups = nil
		return d, nil
	}
	if rj, idx := podLabels[labelJobSetReplicatedJob], podLabels[labelJobSetJobIndex]; rj != "" && idx != "" {
		d.subGroup = rj + "-" + idx
	}
	return d, nil
}

// LeaderWorkerSet pod labels: the replica (group) a pod belongs to, and its
// place in it (0 is the leader).
const (
	labelLWSGroupIndex  = "leaderworkerset.sigs.k8s.io/group-index"
	labelLWSWorkerIndex = "leaderworkerset.sigs.k8s.io/worker-index"
)

// deriveLWS: one gang per replica, its leader and workers (size pods), with
// subgroups leader (1) and workers (size-1).
func deriveLWS(obj map[string]any, podLabels map[string]string) (decision, error) {
	size, err := intField(obj, 1, "spec", "leaderWorkerTemplate", "size")
	if err != nil {
		return decision{}, err
	}
	if size < 1 {
		return decision{}, fmt.Errorf("spec.leaderWorkerTemplate.size: %d is below 1", size)
	}
	idx := podLabels[labelLWSGroupIndex]
	if _, err := strconv.ParseUint(idx, 10, 31); err != nil {
		return decision{}, fmt.Errorf("pod label %s: %q is not a group index", labelLWSGroupIndex, idx)
	}
	d := decision{suffix: idx, min: size, subGroups: []SubGroup{{Name: "leader", MinMember: 1}}}
	if size > 1 {
		d.subGroups = append(d.subGroups, SubGroup{Name: "workers", MinMember: int32(size - 1)})
	}
	d.subGroup = "workers"
	if w, ok := podLabels[labelLWSWorkerIndex]; !ok || w == "0" {
		d.subGroup = "leader"
	}
	return d, nil
}

// KubeRay pod labels.
const (
	labelRayNodeType = "ray.io/node-type"
	labelRayGroup    = "ray.io/group"
)

// deriveRay: the head and, of each worker group, minReplicas × numOfHosts
// pods (a multi-host group's replica is numOfHosts pods), with a subgroup
// "head" and one per worker group that has a minimum.
func deriveRay(obj map[string]any, podLabels map[string]string) (decision, error) {
	wgs, err := listField(obj, "spec", "workerGroupSpecs")
	if err != nil {
		return decision{}, err
	}
	d := decision{subGroups: []SubGroup{{Name: "head", MinMember: 1}}}
	all := []int64{1}
	has := map[string]bool{"head": true}
	for i, wg := range wgs {
		name, err := stringField(wg, "groupName")
		minR, err2 := intField(wg, 0, "minReplicas")
		hosts, err3 := intField(wg, 1, "numOfHosts")
		for _, e := range []error{err, err2, err3} {
			if e != nil {
				return decision{}, fmt.Errorf("spec.workerGroupSpecs[%d]: %w", i, e)
			}
		}
		hosts = max(hosts, 1)
		if minR*hosts > maxMembers {
			return decision{}, fmt.Errorf("spec.workerGroupSpecs[%d]: %d replicas × %d hosts is more than %d pods", i, minR, hosts, maxMembers)
		}
		all = append(all, minR*hosts)
		if minR > 0 && name != "" && name != "head" && !has[name] && len(d.subGroups) < maxSubGroups {
			has[name] = true
			d.subGroups = append(d.subGroups, SubGroup{Name: name, MinMember: int32(minR * hosts)})
		}
	}
	if d.min, err = sum("spec.workerGroupSpecs", all...); err != nil {
		return decision{}, err
	}
	switch g := podLabels[labelRayGroup]; {
	case podLabels[labelRayNodeType] == "head":
		d.subGroup = "head"
	case has[g] && g != "head":
		d.subGroup = g
	}
	return d, nil
}
