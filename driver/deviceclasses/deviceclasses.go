// Package deviceclasses holds the DeviceClass manifests of gpu.tessera.dev,
// embedded so tests and tools apply exactly the files the chart ships.
package deviceclasses

import (
	"bytes"
	"embed"
	"fmt"
	"io"
	"io/fs"
	"sort"

	resourceapi "k8s.io/api/resource/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/tessera-gpu/tessera/internal/draname"
)

// Names of the DeviceClasses (internal/draname; DESIGN.md, Names).
const (
	Exclusive   = draname.ClassExclusive
	MPS         = draname.ClassMPS
	TimeSlicing = draname.ClassTimeSlicing
)

// FS holds the manifests (*.yaml).
//
//go:embed *.yaml
var FS embed.FS

// Load decodes every DeviceClass in FS, sorted by name.
func Load() ([]*resourceapi.DeviceClass, error) {
	files, err := fs.Glob(FS, "*.yaml")
	if err != nil {
		return nil, err
	}
	var out []*resourceapi.DeviceClass
	for _, f := range files {
		data, err := FS.ReadFile(f)
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var dc resourceapi.DeviceClass
			if err := dec.Decode(&dc); err == io.EOF {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if dc.Name == "" {
				continue
			}
			out = append(out, &dc)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
