package webhook

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/internal/assignment"
)

// reviewOf wraps pods in an AdmissionReview as the API server sends it.
func reviewOf(t testing.TB, op admissionv1.Operation, pod, old *v1.Pod) []byte {
	t.Helper()
	req := &admissionv1.AdmissionRequest{UID: "uid-1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: op}
	var err error
	if req.Object.Raw, err = json.Marshal(pod); err != nil {
		t.Fatal(err)
	}
	if old != nil {
		if req.OldObject.Raw, err = json.Marshal(old); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: req})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// FuzzAdmissionReview sends raw bytes to the webhook's handler as the API
// server would. Whatever comes in: no panic; a body that is an
// AdmissionReview with a request gets a response for that request (a
// denial always says why); every pod the webhook lets through with its
// patch applied is one the scheduler accepts as far as the pod alone
// tells (kube.PodAdmissionError), and every CREATE it denies is denied in
// the scheduler's words. Seeds: the repo's example pods, created and
// updated, and the values of issue 17.
func FuzzAdmissionReview(f *testing.F) {
	file, err := os.Open("../../demo/device-plugin/pods.yaml")
	if err != nil {
		f.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(file, 4096)
	for {
		var p v1.Pod
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			f.Fatal(err)
		}
		f.Add(reviewOf(f, admissionv1.Create, &p, nil))
		bound := p.DeepCopy()
		bound.Spec.NodeName = "n1"
		changed := bound.DeepCopy()
		if changed.Annotations == nil {
			changed.Annotations = map[string]string{}
		}
		changed.Annotations[assignment.AnnotationGPUMemory] = "40Gi"
		f.Add(reviewOf(f, admissionv1.Update, changed, bound))
	}
	file.Close()
	for _, v := range []string{"9223372036854775808", "1e19", "10E", "1e100", "20Gi", "1e9999999"} {
		f.Add(reviewOf(f, admissionv1.Create, testPod(map[string]string{assignment.AnnotationGPUMemory: v}, ""), nil))
	}
	f.Add([]byte(`{"request":{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"UPDATE","object":{"metadata":{"annotations":{"tessera.dev/gpu-fraction":"0.5"}}}}}`))
	f.Add([]byte(`{"request":{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","object":null}}`))
	f.Add([]byte(`{`))

	h := Handler()
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body)))
		var in admissionv1.AdmissionReview
		if json.Unmarshal(body, &in) != nil || in.Request == nil {
			if rec.Code != http.StatusBadRequest {
				t.Fatalf("not an AdmissionReview, answered %d", rec.Code)
			}
			return
		}
		if rec.Code != http.StatusOK {
			t.Fatalf("an AdmissionReview answered %d: %s", rec.Code, rec.Body)
		}
		var out admissionv1.AdmissionReview
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
			t.Fatalf("no response: %v %s", err, rec.Body)
		}
		resp := out.Response
		if resp.UID != in.Request.UID {
			t.Fatalf("response for %q, request %q", resp.UID, in.Request.UID)
		}
		if !resp.Allowed && (resp.Result == nil || resp.Result.Message == "") {
			t.Fatal("a denial without a reason")
		}
		checkAgainstScheduler(t, in.Request, resp)
	})
}

// checkAgainstScheduler: a pod let through is one the scheduler accepts
// (from the pod alone), and a CREATE denied for the pod is denied in the
// scheduler's words.
func checkAgainstScheduler(t *testing.T, req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) {
	if req.Kind.Group != "" || req.Kind.Kind != "Pod" || req.SubResource != "" {
		if !resp.Allowed || len(resp.Patch) > 0 {
			t.Fatal("another kind or a subresource was not passed unchanged")
		}
		return
	}
	var pod v1.Pod
	if json.Unmarshal(req.Object.Raw, &pod) != nil || req.Operation != admissionv1.Create {
		return
	}
	if _, has, _ := kube.FractionRequest(pod.Annotations); !has {
		if !resp.Allowed || len(resp.Patch) > 0 {
			t.Fatal("a pod without the annotations was not passed unchanged")
		}
		return
	}
	want := kube.PodAdmissionError(&pod)
	if !resp.Allowed {
		if resp.Result.Code == http.StatusUnprocessableEntity && (want == nil || want.Error() != resp.Result.Message) {
			t.Fatalf("denied with %q; the scheduler's words are %v", resp.Result.Message, want)
		}
		return
	}
	// The API server applies the patch to the pod as it serialises it
	// (every member of its struct present, keys as spelt in the API);
	// the fuzzed bytes may spell keys otherwise ("oBjeCt", no "spec"),
	// which encoding/json reads but a JSON patch cannot address
	// (testdata/fuzz/FuzzAdmissionReview/052e8a6584fd7b4f).
	patched, err := json.Marshal(&pod)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Patch) > 0 {
		p, err := jsonpatch.DecodePatch(resp.Patch)
		if err != nil {
			t.Fatalf("patch: %v", err)
		}
		if patched, err = p.Apply(patched); err != nil {
			t.Fatalf("applying the patch: %v", err)
		}
	}
	var after v1.Pod
	if err := json.Unmarshal(patched, &after); err != nil {
		t.Fatalf("patched pod: %v", err)
	}
	err = kube.PodAdmissionError(&after)
	if errors.Is(err, kube.ErrNoShareSlot) && len(after.Spec.Containers) == 0 {
		err = nil // no container to hold the slot: the API refuses such a pod
	}
	if err != nil {
		t.Fatalf("let through a pod the scheduler refuses: %v", err)
	}
}
