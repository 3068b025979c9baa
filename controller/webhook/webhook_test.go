package webhook

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/internal/selfsigned"
)

func testPod(ann map[string]string, scheduler string, containers ...v1.Container) *v1.Pod {
	if len(containers) == 0 {
		containers = []v1.Container{{Name: "main", Image: "busybox"}}
	}
	return &v1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Annotations: ann},
		Spec:       v1.PodSpec{SchedulerName: scheduler, Containers: containers},
	}
}

// admit sends the pod through the HTTP handler as the API server would and
// returns the response and the pod with the patch applied.
// old is the pod before an UPDATE (nil for CREATE).
func admit(t *testing.T, pod, old *v1.Pod, op admissionv1.Operation) (*admissionv1.AdmissionResponse, *v1.Pod) {
	t.Helper()
	raw, err := json.Marshal(pod)
	require.NoError(t, err)
	in := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: types.UID("req-1"), Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Operation: op, Namespace: pod.Namespace, Name: pod.Name, Object: runtime.RawExtension{Raw: raw}},
	}
	if old != nil {
		in.Request.OldObject.Raw, err = json.Marshal(old)
		require.NoError(t, err)
	}
	body, err := json.Marshal(in)
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body)))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var out admissionv1.AdmissionReview
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out))
	require.NotNil(t, out.Response)
	assert.Equal(t, "admission.k8s.io/v1", out.APIVersion)
	assert.Equal(t, types.UID("req-1"), out.Response.UID)
	got := pod.DeepCopy()
	if len(out.Response.Patch) > 0 {
		require.Equal(t, admissionv1.PatchTypeJSONPatch, *out.Response.PatchType)
		p, err := jsonpatch.DecodePatch(out.Response.Patch)
		require.NoError(t, err)
		patched, err := p.Apply(raw)
		require.NoError(t, err)
		got = &v1.Pod{}
		require.NoError(t, json.Unmarshal(patched, got))
	}
	return out.Response, got
}

func TestAdmission(t *testing.T) {
	half := map[string]string{assignment.AnnotationGPUFraction: "0.5"}
	one := resource.MustParse("1")
	slot := v1.ResourceList{assignment.ResourceShare: one}
	withCPU := v1.Container{Name: "main", Image: "busybox", Resources: v1.ResourceRequirements{
		Limits: v1.ResourceList{v1.ResourceCPU: resource.MustParse("2")}, Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("1")}}}
	cases := []struct {
		name      string
		pod       *v1.Pod
		op        admissionv1.Operation
		deny      string // a part of the denial; "" when allowed
		unchanged bool
		scheduler string          // expected schedulerName after the patch
		first     v1.ResourceList // expected limits (= requests for the slot) of the first container
	}{
		{name: "plain pod", pod: testPod(map[string]string{"x": "y"}, ""), unchanged: true},
		{name: "no annotations at all", pod: testPod(nil, "default-scheduler"), unchanged: true},
		{name: "fraction, default scheduler", pod: testPod(half, "default-scheduler"), scheduler: "tessera-scheduler", first: slot},
		{name: "memory, no scheduler", pod: testPod(map[string]string{assignment.AnnotationGPUMemory: "20Gi", assignment.AnnotationGPUSharing: "timeslice"}, ""), scheduler: "tessera-scheduler", first: slot},
		{name: "keeps other resources", pod: testPod(half, "tessera-scheduler", withCPU, v1.Container{Name: "side"}), scheduler: "tessera-scheduler",
			first: v1.ResourceList{v1.ResourceCPU: resource.MustParse("2"), assignment.ResourceShare: one}},
		{name: "another scheduler is kept", pod: testPod(half, "my-scheduler"), scheduler: "my-scheduler", first: slot},
		{name: "slot already asked by a second container", pod: testPod(half, "tessera-scheduler", v1.Container{Name: "a"}, v1.Container{Name: "b", Resources: v1.ResourceRequirements{Limits: slot, Requests: slot}}), unchanged: true},
		{name: "bad fraction", pod: testPod(map[string]string{assignment.AnnotationGPUFraction: "half"}, ""), deny: `annotation tessera.dev/gpu-fraction: "half" is not a fraction between 0 and 1`},
		{name: "bad memory", pod: testPod(map[string]string{assignment.AnnotationGPUMemory: "lots"}, ""), deny: `annotation tessera.dev/gpu-memory: "lots" is not a positive amount of memory`},
		{name: "bad sharing", pod: testPod(map[string]string{assignment.AnnotationGPUFraction: "0.5", assignment.AnnotationGPUSharing: "mig"}, ""), deny: `annotation tessera.dev/gpu-sharing: "mig" is not mps or timeslice`},
		{name: "sharing alone", pod: testPod(map[string]string{assignment.AnnotationGPUSharing: "mps"}, ""), deny: "annotation tessera.dev/gpu-sharing without"},
		{name: "both", pod: testPod(map[string]string{assignment.AnnotationGPUFraction: "0.5", assignment.AnnotationGPUMemory: "1Gi"}, ""), deny: "give one, not both"},
		// What the scheduler would refuse, in its words (kube.PodAdmissionError).
		{name: "memory past 2^63", pod: testPod(map[string]string{assignment.AnnotationGPUMemory: "9223372036854775808"}, ""),
			deny: `annotation tessera.dev/gpu-memory: "9223372036854775808" is more memory than any GPU has; the most Tessera accepts is 64Ti`},
		{name: "memory 1e19", pod: testPod(map[string]string{assignment.AnnotationGPUMemory: "1e19"}, ""), deny: `"1e19" is more memory than any GPU has`},
		{name: "memory 10E", pod: testPod(map[string]string{assignment.AnnotationGPUMemory: "10E"}, ""), deny: `"10E" is more memory than any GPU has`},
		{name: "memory 1e100", pod: testPod(map[string]string{assignment.AnnotationGPUMemory: "1e100"}, ""), deny: `"1e100" is more memory than any GPU has`},
		{name: "annotated pod asking an absurd CPU", pod: testPod(half, "", v1.Container{Name: "main", Resources: v1.ResourceRequirements{
			Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("9223372036854776")}}}), deny: "asks for cpu 9223372036854776: is above the most Tessera accepts"},
		{name: "annotated pod asking whole GPUs too", pod: testPod(half, "", v1.Container{Name: "main", Resources: v1.ResourceRequirements{
			Limits: v1.ResourceList{"nvidia.com/gpu": one}, Requests: v1.ResourceList{"nvidia.com/gpu": one}}}), deny: "ask for a share or for whole GPUs, not both"},
		{name: "update without an old object is refused", pod: testPod(half, ""), op: admissionv1.Update, deny: "decoding the pod's old version"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			op := c.op
			if op == "" {
				op = admissionv1.Create
			}
			resp, got := admit(t, c.pod, nil, op)
			if c.deny != "" {
				assert.False(t, resp.Allowed)
				require.NotNil(t, resp.Result)
				assert.Contains(t, resp.Result.Message, c.deny)
				return
			}
			assert.True(t, resp.Allowed)
			if c.unchanged {
				assert.Empty(t, resp.Patch)
				return
			}
			assert.Equal(t, c.scheduler, got.Spec.SchedulerName)
			res := got.Spec.Containers[0].Resources
			assert.Equal(t, c.first, res.Limits)
			assert.Equal(t, one, res.Requests[assignment.ResourceShare])
			for _, other := range got.Spec.Containers[1:] {
				assert.NotContains(t, other.Resources.Limits, assignment.ResourceShare, "only the first container gets the slot")
			}
			assert.Equal(t, c.pod.Annotations, got.Annotations, "annotations are kept")
		})
	}
}

// TestUpdate: only a change of the fraction annotations is judged; on a
// bound pod it is denied, on a pending one it must be what the scheduler
// accepts. UPDATE never mutates.
func TestUpdate(t *testing.T) {
	slot := v1.Container{Name: "main", Resources: v1.ResourceRequirements{
		Limits: v1.ResourceList{assignment.ResourceShare: resource.MustParse("1")}, Requests: v1.ResourceList{assignment.ResourceShare: resource.MustParse("1")}}}
	mem := func(v string) map[string]string { return map[string]string{assignment.AnnotationGPUMemory: v} }
	bound := func(p *v1.Pod) *v1.Pod { p.Spec.NodeName = "node-a"; return p }
	withLabel := func(p *v1.Pod) *v1.Pod { p.Labels = map[string]string{"x": "y"}; return p }
	cases := []struct {
		name     string
		old, pod *v1.Pod
		deny     string
	}{
		{name: "bound, share changed", old: bound(testPod(mem("20Gi"), "tessera-scheduler", slot)), pod: bound(testPod(mem("40Gi"), "tessera-scheduler", slot)),
			deny: `pod is bound to node node-a and the node enforces the GPU share it was given: its fraction annotations cannot change (tessera.dev/gpu-memory "20Gi" → "40Gi"); delete the pod and create it again with the new share`},
		{name: "bound, annotation removed", old: bound(testPod(mem("20Gi"), "tessera-scheduler", slot)), pod: bound(testPod(nil, "tessera-scheduler", slot)),
			deny: `tessera.dev/gpu-memory removed (was "20Gi")`},
		{name: "bound, sharing added", old: bound(testPod(mem("20Gi"), "tessera-scheduler", slot)),
			pod:  bound(testPod(map[string]string{assignment.AnnotationGPUMemory: "20Gi", assignment.AnnotationGPUSharing: "timeslice"}, "tessera-scheduler", slot)),
			deny: `tessera.dev/gpu-sharing added ("timeslice")`},
		{name: "bound, annotations unchanged, a label added", old: bound(testPod(mem("20Gi"), "tessera-scheduler", slot)), pod: withLabel(bound(testPod(mem("20Gi"), "tessera-scheduler", slot)))},
		{name: "an invalid pod may still lose a finalizer", old: testPod(mem("1e19"), "tessera-scheduler", slot), pod: withLabel(testPod(mem("1e19"), "tessera-scheduler", slot))},
		{name: "pending, changed to a valid share", old: testPod(mem("20Gi"), "tessera-scheduler", slot), pod: testPod(mem("10Gi"), "tessera-scheduler", slot)},
		{name: "pending, changed to an absurd share", old: testPod(mem("20Gi"), "tessera-scheduler", slot), pod: testPod(mem("1e19"), "tessera-scheduler", slot),
			deny: `annotation tessera.dev/gpu-memory: "1e19" is more memory than any GPU has; the most Tessera accepts is 64Ti`},
		{name: "pending, annotation added without the slot", old: testPod(nil, "tessera-scheduler"), pod: testPod(mem("20Gi"), "tessera-scheduler"),
			deny: "asks for a GPU share through annotations, but no container asks for the tessera.dev/gpu-share resource"},
		{name: "pending, annotation removed, slot kept", old: testPod(mem("20Gi"), "tessera-scheduler", slot), pod: testPod(nil, "tessera-scheduler", slot),
			deny: "asks for tessera.dev/gpu-share without annotation tessera.dev/gpu-fraction or tessera.dev/gpu-memory"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, _ := admit(t, c.pod, c.old, admissionv1.Update)
			assert.Empty(t, resp.Patch, "UPDATE never mutates")
			if c.deny == "" {
				assert.True(t, resp.Allowed, "%+v", resp.Result)
				return
			}
			assert.False(t, resp.Allowed)
			require.NotNil(t, resp.Result)
			assert.Contains(t, resp.Result.Message, c.deny)
		})
	}
}

// The webhook and the scheduler give the same words: a pod the webhook
// denies waits with its message as reason (kube.PodAdmissionError is the
// one function behind both).
func TestDenialIsTheSchedulersReason(t *testing.T) {
	slot := v1.Container{Name: "main", Resources: v1.ResourceRequirements{
		Limits: v1.ResourceList{assignment.ResourceShare: resource.MustParse("1")}, Requests: v1.ResourceList{assignment.ResourceShare: resource.MustParse("1")}}}
	for _, v := range []string{"9223372036854775808", "1e19", "10E", "1e100", "lots", "0"} {
		pod := testPod(map[string]string{assignment.AnnotationGPUMemory: v}, "tessera-scheduler", slot)
		resp, _ := admit(t, pod, nil, admissionv1.Create)
		require.False(t, resp.Allowed, v)
		assert.Equal(t, kube.PodAdmissionError(pod).Error(), resp.Result.Message, v)
	}
}

func TestHandlerRejectsGarbage(t *testing.T) {
	rec := httptest.NewRecorder()
	Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, Path, bytes.NewReader([]byte("{"))))
	assert.Equal(t, http.StatusBadRequest, rec.Code)
	rec = httptest.NewRecorder()
	Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, Path, nil))
	assert.Equal(t, http.StatusMethodNotAllowed, rec.Code)
}

// TestCertReload checks that a rotated certificate is served without a
// restart.
func TestCertReload(t *testing.T) {
	dir := t.TempDir()
	write := func(cn string) *x509.CertPool {
		crt, key, err := selfsigned.Generate(cn, "127.0.0.1")
		require.NoError(t, err)
		require.NoError(t, selfsigned.WriteDir(dir, crt, key))
		pool := x509.NewCertPool()
		require.True(t, pool.AppendCertsFromPEM(crt))
		return pool
	}
	first := write("first")
	s, err := New(Options{Addr: "127.0.0.1:0", CertDir: dir})
	require.NoError(t, err)
	go func() { _ = s.Run(t.Context()) }()
	served := func(pool *x509.CertPool) string {
		conn, err := tls.Dial("tcp", s.Addr(), &tls.Config{RootCAs: pool})
		if err != nil {
			return "error: " + err.Error()
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	assert.Equal(t, "first", served(first))
	second := write("second")
	later := time.Now().Add(time.Hour) // a distinct modification time
	require.NoError(t, os.Chtimes(filepath.Join(dir, "tls.crt"), later, later))
	require.Eventually(t, func() bool { return served(second) == "second" }, 10*time.Second, 100*time.Millisecond, "the new certificate is served")

	_, err = New(Options{Addr: "127.0.0.1:0", CertDir: t.TempDir()})
	assert.Error(t, err, "no certificate: no server")
}
