package webhook

import (
	"encoding/json"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/controller/kube"
)

// SchedulePath serves the namespace opt-in: the API server sends it the
// pods created in namespaces labelled tessera.dev/scheduler: enabled (the
// configuration's namespaceSelector, ScheduleNamespaceSelector), and it
// sets their schedulerName to tessera-scheduler, so a team's Job and
// operator manifests work unchanged. It reads nothing from the cluster: the
// API server matches the namespace's label, so the controller needs no
// right to read namespaces for it.
const SchedulePath = "/schedule-pods"

// ScheduleMatchCondition sends only pods that name no scheduler of their
// own (the API server has defaulted an empty schedulerName to
// default-scheduler before admission): a pod that names another scheduler
// is left alone, and costs no call.
const ScheduleMatchCondition = `!has(object.spec.schedulerName) || object.spec.schedulerName == "" || object.spec.schedulerName == "` + v1.DefaultSchedulerName + `"`

// ScheduleNamespaceSelector is the label a namespace opts in with.
var ScheduleNamespaceSelector = map[string]string{kube.LabelNamespaceScheduler: kube.NamespaceSchedulerEnabled}

// MutateScheduler is the opt-in's decision for a pod being created: set
// schedulerName tessera-scheduler when it is empty or default-scheduler;
// nothing otherwise (another scheduler was chosen on purpose).
func MutateScheduler(pod *v1.Pod) []patchOp {
	if s := pod.Spec.SchedulerName; s == "" || s == v1.DefaultSchedulerName {
		return []patchOp{{Op: "add", Path: "/spec/schedulerName", Value: kube.SchedulerName}}
	}
	return nil
}

// scheduleReview answers one AdmissionRequest of the opt-in: pods on
// CREATE only; everything else passes unchanged.
func scheduleReview(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Kind.Group != "" || req.Kind.Kind != "Pod" || req.SubResource != "" || req.Operation != admissionv1.Create {
		return resp
	}
	var pod v1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusBadRequest, Reason: metav1.StatusReasonBadRequest,
			Message: fmt.Sprintf("decoding the pod: %v", err)}
		return resp
	}
	if ops := MutateScheduler(&pod); len(ops) > 0 {
		patch, _ := json.Marshal(ops) // plain values: cannot fail
		pt := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = patch, &pt
	}
	return resp
}

// ScheduleHandler serves the opt-in's AdmissionReviews.
func ScheduleHandler() http.Handler { return reviewHandler(scheduleReview) }
