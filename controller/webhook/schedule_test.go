package webhook

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestScheduleOptIn: in an opted-in namespace a pod that names no
// scheduler (or default-scheduler) gets tessera-scheduler; one that names
// another keeps it; updates, other kinds and subresources pass unchanged.
func TestScheduleOptIn(t *testing.T) {
	tests := []struct {
		name      string
		op        admissionv1.Operation
		scheduler string
		sub       string
		want      string // the patch's schedulerName, "" for no patch
	}{
		{name: "empty", op: admissionv1.Create, want: "tessera-scheduler"},
		{name: "default-scheduler", op: admissionv1.Create, scheduler: "default-scheduler", want: "tessera-scheduler"},
		{name: "ours already", op: admissionv1.Create, scheduler: "tessera-scheduler"},
		{name: "another scheduler", op: admissionv1.Create, scheduler: "volcano"},
		{name: "update", op: admissionv1.Update},
		{name: "binding", op: admissionv1.Create, sub: "binding"},
	}
	srv := httptest.NewServer(ScheduleHandler())
	defer srv.Close()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1.PodSpec{SchedulerName: tc.scheduler, Containers: []v1.Container{{Name: "c"}}}}
			raw, _ := json.Marshal(pod)
			rev := admissionv1.AdmissionReview{Request: &admissionv1.AdmissionRequest{
				UID: "u", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: tc.op, SubResource: tc.sub,
				Object: runtime.RawExtension{Raw: raw}, OldObject: runtime.RawExtension{Raw: raw},
			}}
			body, _ := json.Marshal(rev)
			resp, err := http.Post(srv.URL, "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var out admissionv1.AdmissionReview
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
				t.Fatal(err)
			}
			if !out.Response.Allowed || out.Response.UID != "u" {
				t.Fatalf("response %+v", out.Response)
			}
			var ops []patchOp
			if len(out.Response.Patch) > 0 {
				if err := json.Unmarshal(out.Response.Patch, &ops); err != nil {
					t.Fatal(err)
				}
			}
			switch {
			case tc.want == "" && len(ops) > 0:
				t.Fatalf("unexpected patch %s", out.Response.Patch)
			case tc.want != "" && (len(ops) != 1 || ops[0].Path != "/spec/schedulerName" || ops[0].Value != tc.want):
				t.Fatalf("patch %s, want schedulerName %s", out.Response.Patch, tc.want)
			}
		})
	}
}
