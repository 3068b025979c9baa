// Package webhook is tessera-controller's mutating admission webhook for
// pods that ask for a GPU share through DESIGN.md's fraction annotations
// (tessera.dev/gpu-fraction, tessera.dev/gpu-memory, tessera.dev/gpu-sharing).
// On CREATE it denies a malformed annotation with the message the scheduler
// would give, and otherwise makes the pod schedulable by Tessera's
// device-plugin path: one tessera.dev/gpu-share slot on the first container
// (requests and limits) and schedulerName tessera-scheduler. Pods without
// the annotations pass unchanged. Every replica serves it, leader or not
// (README.md).
package webhook

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/internal/assignment"
)

// Path is where the webhook is served.
const Path = "/mutate-pods"

// MatchCondition is the CEL expression of the MutatingWebhookConfiguration's
// matchConditions: only pods carrying one of the fraction annotations are
// sent to the webhook, so an outage of the webhook (failurePolicy Fail)
// never blocks other pods. The chart's template carries the same expression.
const MatchCondition = `has(object.metadata.annotations) && (` +
	`"` + assignment.AnnotationGPUFraction + `" in object.metadata.annotations || ` +
	`"` + assignment.AnnotationGPUMemory + `" in object.metadata.annotations || ` +
	`"` + assignment.AnnotationGPUSharing + `" in object.metadata.annotations)`

// patchOp is one JSONPatch operation.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// Mutate is the admission decision for a pod being created: the JSONPatch
// operations to apply (none for a pod without the fraction annotations), or
// an error that denies the pod, naming the malformed annotation and its
// value.
//
//   - One tessera.dev/gpu-share slot goes into the requests and limits of
//     the first container (the kubelet calls the device plugin for a
//     container that asks for it; which GPU and how much of it come from the
//     assignment, so which container holds the slot does not matter to the
//     share). A pod in which some container already asks for the slot is
//     left as it is.
//   - schedulerName becomes tessera-scheduler when it is empty or
//     default-scheduler: no other scheduler understands the annotations, and
//     one that did not would place the pod without its share. A pod that
//     names another scheduler keeps it (someone chose it on purpose).
func Mutate(pod *v1.Pod) ([]patchOp, error) {
	if _, has, err := kube.FractionRequest(pod.Annotations); !has {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var ops []patchOp
	if len(pod.Spec.Containers) > 0 && !asksForSlot(pod) {
		res := *pod.Spec.Containers[0].Resources.DeepCopy()
		one := resource.MustParse("1")
		if res.Limits == nil {
			res.Limits = v1.ResourceList{}
		}
		if res.Requests == nil {
			res.Requests = v1.ResourceList{}
		}
		res.Limits[assignment.ResourceShare] = one
		res.Requests[assignment.ResourceShare] = one
		// "add" replaces the member when it exists: the whole resources
		// object, so the patch holds whether or not it was serialised.
		ops = append(ops, patchOp{Op: "add", Path: "/spec/containers/0/resources", Value: res})
	}
	if s := pod.Spec.SchedulerName; s == "" || s == v1.DefaultSchedulerName {
		ops = append(ops, patchOp{Op: "add", Path: "/spec/schedulerName", Value: kube.SchedulerName})
	}
	return ops, nil
}

// asksForSlot reports whether any container (init containers included)
// asks for the share slot.
func asksForSlot(pod *v1.Pod) bool {
	for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			if _, ok := c.Resources.Limits[assignment.ResourceShare]; ok {
				return true
			}
			if _, ok := c.Resources.Requests[assignment.ResourceShare]; ok {
				return true
			}
		}
	}
	return false
}

// review answers one AdmissionRequest.
func review(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Kind.Group != "" || req.Kind.Kind != "Pod" || req.Operation != admissionv1.Create || req.SubResource != "" {
		return resp
	}
	var pod v1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusBadRequest, Reason: metav1.StatusReasonBadRequest, Message: fmt.Sprintf("decoding the pod: %v", err)}
		return resp
	}
	ops, err := Mutate(&pod)
	if err != nil {
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusUnprocessableEntity, Reason: metav1.StatusReasonInvalid, Message: err.Error()}
		return resp
	}
	if len(ops) > 0 {
		patch, err := json.Marshal(ops)
		if err != nil { // plain values: cannot fail
			resp.Allowed = false
			resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInternalServerError, Message: err.Error()}
			return resp
		}
		pt := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = patch, &pt
	}
	return resp
}

// maxBody bounds an AdmissionReview (a pod is far smaller; the API server
// caps objects at 3 MiB).
const maxBody = 8 << 20

// Handler serves AdmissionReviews (admission.k8s.io/v1) at any path.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST an AdmissionReview", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var in admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &in); err != nil || in.Request == nil {
			http.Error(w, fmt.Sprintf("not an AdmissionReview: %v", err), http.StatusBadRequest)
			return
		}
		out := admissionv1.AdmissionReview{TypeMeta: in.TypeMeta, Response: review(in.Request)}
		if out.APIVersion == "" {
			out.APIVersion, out.Kind = "admission.k8s.io/v1", "AdmissionReview"
		}
		if !out.Response.Allowed {
			klog.V(2).InfoS("Denied a pod", "pod", klog.KRef(in.Request.Namespace, in.Request.Name), "reason", out.Response.Result.Message)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
}
