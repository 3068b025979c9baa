// Package webhook is tessera-controller's mutating admission webhook for
// pods that ask for a GPU share through DESIGN.md's fraction annotations
// (tessera.dev/gpu-fraction, tessera.dev/gpu-memory, tessera.dev/gpu-sharing).
// On CREATE it denies what the scheduler would refuse (a malformed
// annotation, an amount out of range) with the message the scheduler would
// give (kube.PodAdmissionError), and otherwise makes the pod schedulable by
// Tessera's device-plugin path: one tessera.dev/gpu-share slot on the first
// container (requests and limits) and schedulerName tessera-scheduler. On
// UPDATE it denies a change of the annotations on a bound pod (the node
// enforces the share it was given) and a change the scheduler would refuse.
// Pods without the annotations pass unchanged. Every replica serves it,
// leader or not (README.md).
package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

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
// matchConditions: only pods carrying one of the fraction annotations, or
// (UPDATE) carrying one before, are sent to the webhook, so an outage of
// the webhook (failurePolicy Fail) never blocks other pods. oldObject is
// null on CREATE. The chart's template carries the same expression.
const MatchCondition = `(has(object.metadata.annotations) && (` +
	`"` + assignment.AnnotationGPUFraction + `" in object.metadata.annotations || ` +
	`"` + assignment.AnnotationGPUMemory + `" in object.metadata.annotations || ` +
	`"` + assignment.AnnotationGPUSharing + `" in object.metadata.annotations)) || ` +
	`(oldObject != null && has(oldObject.metadata.annotations) && (` +
	`"` + assignment.AnnotationGPUFraction + `" in oldObject.metadata.annotations || ` +
	`"` + assignment.AnnotationGPUMemory + `" in oldObject.metadata.annotations || ` +
	`"` + assignment.AnnotationGPUSharing + `" in oldObject.metadata.annotations))`

// patchOp is one JSONPatch operation.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// Mutate is the admission decision for a pod being created: the JSONPatch
// operations to apply (none for a pod without the fraction annotations), or
// an error that denies the pod in the scheduler's words
// (kube.PodAdmissionError), naming the annotation or resource and its value.
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
	if _, has, _ := kube.FractionRequest(pod.Annotations); !has {
		return nil, nil
	}
	// The slot is what this webhook adds: its absence is no reason here.
	if err := kube.PodAdmissionError(pod); err != nil && !errors.Is(err, kube.ErrNoShareSlot) {
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
// requests the share slot, as the scheduler counts it (requests; the API
// server has defaulted them from limits before admission). A slot of 0
// is no slot.
func asksForSlot(pod *v1.Pod) bool {
	for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			if q, ok := c.Resources.Requests[assignment.ResourceShare]; ok && q.Sign() > 0 {
				return true
			}
		}
	}
	return false
}

// fractionKeys are the annotations an UPDATE of a bound pod may not change.
var fractionKeys = []string{assignment.AnnotationGPUFraction, assignment.AnnotationGPUMemory, assignment.AnnotationGPUSharing}

// Update is the admission decision for a pod being updated (no mutation:
// resources and schedulerName cannot change after creation): nil allows
// it. Only a change of the fraction annotations is judged, so an update
// that leaves them alone (a finalizer removed, a label added) is never
// blocked. On a bound pod such a change is denied: the controller would
// count a share other than the one the node enforces. On a pod not bound
// yet, the new pod must be one the scheduler accepts
// (kube.PodAdmissionError; the share slot cannot be added now, so a pod
// without it is denied too).
func Update(old, pod *v1.Pod) error {
	var changed []string
	for _, k := range fractionKeys {
		a, hadA := old.Annotations[k]
		b, hasB := pod.Annotations[k]
		switch {
		case hadA == hasB && a == b:
		case !hadA:
			changed = append(changed, fmt.Sprintf("%s added (%q)", k, b))
		case !hasB:
			changed = append(changed, fmt.Sprintf("%s removed (was %q)", k, a))
		default:
			changed = append(changed, fmt.Sprintf("%s %q → %q", k, a, b))
		}
	}
	if len(changed) == 0 {
		return nil
	}
	if old.Spec.NodeName != "" {
		return fmt.Errorf("pod is bound to node %s and the node enforces the GPU share it was given: its fraction annotations cannot change (%s); delete the pod and create it again with the new share",
			old.Spec.NodeName, strings.Join(changed, ", "))
	}
	return kube.PodAdmissionError(pod)
}

// review answers one AdmissionRequest.
func review(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Kind.Group != "" || req.Kind.Kind != "Pod" || req.SubResource != "" {
		return resp
	}
	deny := func(code int32, reason metav1.StatusReason, msg string) *admissionv1.AdmissionResponse {
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: msg}
		return resp
	}
	var pod, old v1.Pod
	switch req.Operation {
	case admissionv1.Create, admissionv1.Update:
		if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
			return deny(http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("decoding the pod: %v", err))
		}
	default:
		return resp
	}
	if req.Operation == admissionv1.Update {
		if err := json.Unmarshal(req.OldObject.Raw, &old); err != nil {
			return deny(http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("decoding the pod's old version: %v", err))
		}
		if err := Update(&old, &pod); err != nil {
			return deny(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, err.Error())
		}
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

// Handler serves AdmissionReviews (admission.k8s.io/v1) of the fraction
// annotations at any path.
func Handler() http.Handler { return reviewHandler(review) }

// reviewHandler serves AdmissionReviews with answer.
func reviewHandler(answer func(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse) http.Handler {
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
		out := admissionv1.AdmissionReview{TypeMeta: in.TypeMeta, Response: answer(in.Request)}
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
