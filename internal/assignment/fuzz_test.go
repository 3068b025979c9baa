package assignment

import (
	"reflect"
	"strings"
	"testing"
)

// FuzzParse feeds Parse what a pod's assignment annotation may hold (the
// controller writes it; anyone who can edit the pod can too). A value is
// refused with an error that names the annotation, or it validates, and its
// String, what the controller writes, parses back to the same assignment.
func FuzzParse(f *testing.F) {
	for _, s := range []string{`{"gpus":[0,1]}`, `{"gpus":[3],"memoryBytes":1024,"computeMilli":250,"sharing":"MPS"}`,
		`{"gpus":[0,1],"uuids":["GPU-a","GPU-b"]}`, `{"gpus":[2],"memoryBytes":21474836480,"computeMilli":999,"sharing":"TimeSlicing","uuids":["GPU-c"]}`,
		`gpu-3`, `x`, `{"gpus":[]}`, `{"gpus":[1,0]}`, `{"gpus":[1,1]}`, `{"gpus":[-1]}`, `{"gpus":[0],"uuids":[]}`,
		`{"gpus":[0,1],"memoryBytes":1,"computeMilli":5,"sharing":"MPS"}`, `{"gpus":[0],"memoryBytes":5}`, `{"GPUS":[0],"Sharing":""}`,
		`{"gpus":[0],"gpus":[1]}`, `null`, `{"gpus":[9223372036854775807]}`, `{"gpus":[0],"memoryBytes":1e3,"computeMilli":1,"sharing":"MPS"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		a, err := Parse(value)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "annotation "+Annotation+": ") {
				t.Fatalf("error does not name the annotation: %v", err)
			}
			return
		}
		if err := a.Validate(); err != nil {
			t.Fatalf("accepted an invalid assignment %+v: %v", a, err)
		}
		back, err := Parse(a.String())
		if err != nil {
			t.Fatalf("%q parsed to %+v, written as %s, does not parse back: %v", value, a, a.String(), err)
		}
		if len(a.UUIDs) == 0 {
			a.UUIDs = nil // omitempty: [] and none are one
		}
		if !reflect.DeepEqual(back, a) {
			t.Fatalf("%q parsed to %+v, written as %s, parses back to %+v", value, a, a.String(), back)
		}
		if a.IsShare() != (len(a.GPUs) == 1 && a.MemoryBytes > 0) {
			t.Fatalf("%+v: IsShare %v", a, a.IsShare())
		}
	})
}
