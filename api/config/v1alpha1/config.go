package v1alpha1

import (
	"errors"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	sigsjson "sigs.k8s.io/json"
)

// FieldError is a validation error about one field, named by its JSON path
// ("sharing.mps.computePercent"), so a failed Prepare tells the user exactly
// what to fix.
type FieldError struct {
	Path string
	Msg  string
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Msg }

// Decode strictly decodes the raw JSON of an opaque config: unknown or
// duplicate fields, field names in the wrong case, and a wrong apiVersion or
// kind are errors. It does not validate or default.
func Decode(raw []byte) (*GpuConfig, error) {
	if len(strings.TrimSpace(string(raw))) == 0 || strings.TrimSpace(string(raw)) == "null" {
		return nil, errors.New("decoding GpuConfig: empty parameters")
	}
	var c GpuConfig
	// sigs.k8s.io/json matches field names case-sensitively (unlike
	// encoding/json) and reports unknown fields with their full path.
	strictErrs, err := sigsjson.UnmarshalStrict(raw, &c, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return nil, fmt.Errorf("decoding GpuConfig: %w", err)
	}
	if len(strictErrs) > 0 {
		return nil, fmt.Errorf("decoding GpuConfig: %w", errors.Join(strictErrs...))
	}
	var errs []error
	if c.APIVersion != APIVersion {
		errs = append(errs, &FieldError{"apiVersion", fmt.Sprintf("must be %s, got %q", APIVersion, c.APIVersion)})
	}
	if c.Kind != Kind {
		errs = append(errs, &FieldError{"kind", fmt.Sprintf("must be %s, got %q", Kind, c.Kind)})
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("decoding GpuConfig: %w", errors.Join(errs...))
	}
	return &c, nil
}

// Parse decodes and validates one opaque config. A partial config (one
// that leaves the strategy empty so that it can be merged over a class
// config) is accepted.
func Parse(raw []byte) (*GpuConfig, error) {
	c, err := Decode(raw)
	if err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Validate checks the config. Every error names its field path. An empty
// strategy is valid (it means "inherit" when merging, Exclusive otherwise);
// call Default first to check a final config completely.
func (c *GpuConfig) Validate() error {
	if c == nil || c.Sharing == nil {
		return nil
	}
	var errs []error
	s := c.Sharing
	if s.Strategy != "" && !oneOf(s.Strategy, Strategies) {
		errs = append(errs, &FieldError{"sharing.strategy", fmt.Sprintf("must be one of %s, got %q", joinValues(Strategies), s.Strategy)})
	}
	if s.MPS != nil {
		if s.Strategy != "" && s.Strategy != MPS {
			errs = append(errs, &FieldError{"sharing.mps", fmt.Sprintf("only allowed with strategy MPS, strategy is %s", s.Strategy)})
		}
		if p := s.MPS.ComputePercent; p != nil && (*p < 1 || *p > 100) {
			errs = append(errs, &FieldError{"sharing.mps.computePercent", fmt.Sprintf("must be 1..100, got %d", *p)})
		}
	}
	if s.TimeSlicing != nil {
		if s.Strategy != "" && s.Strategy != TimeSlicing {
			errs = append(errs, &FieldError{"sharing.timeSlicing", fmt.Sprintf("only allowed with strategy TimeSlicing, strategy is %s", s.Strategy)})
		}
		if iv := s.TimeSlicing.Interval; iv != "" && !oneOf(iv, Intervals) {
			errs = append(errs, &FieldError{"sharing.timeSlicing.interval", fmt.Sprintf("must be one of %s, got %q", joinValues(Intervals), iv)})
		}
	}
	return errors.Join(errs...)
}

// Default fills in what the config leaves out: type meta, strategy
// Exclusive, an empty MPS section for MPS (compute then follows the memory
// share), and interval Default for TimeSlicing.
func (c *GpuConfig) Default() {
	if c.APIVersion == "" {
		c.APIVersion = APIVersion
	}
	if c.Kind == "" {
		c.Kind = Kind
	}
	if c.Sharing == nil {
		c.Sharing = &GpuSharing{}
	}
	s := c.Sharing
	if s.Strategy == "" {
		s.Strategy = Exclusive
	}
	switch s.Strategy {
	case MPS:
		if s.MPS == nil {
			s.MPS = &MPSConfig{}
		}
	case TimeSlicing:
		if s.TimeSlicing == nil {
			s.TimeSlicing = &TimeSlicingConfig{}
		}
		if s.TimeSlicing.Interval == "" {
			s.TimeSlicing.Interval = IntervalDefault
		}
	}
}

// Merge overlays configs in precedence order (DeviceClass configs first,
// then claim configs; later wins) and returns a new, defaulted config; the
// inputs are not changed. Fields a later config leaves unset are inherited,
// so a claim can write just `sharing.mps.computePercent` over an MPS class.
// A later config that names a different strategy replaces the whole sharing
// section, so settings of the old mode never leak into the new one. Nil
// configs are skipped. The result still needs Validate.
func Merge(configs ...*GpuConfig) *GpuConfig {
	out := &GpuConfig{Sharing: &GpuSharing{}}
	for _, c := range configs {
		if c == nil || c.Sharing == nil {
			continue
		}
		s := c.Sharing
		if s.Strategy != "" && out.Sharing.Strategy != "" && s.Strategy != out.Sharing.Strategy {
			out.Sharing = s.DeepCopy()
			continue
		}
		if s.Strategy != "" {
			out.Sharing.Strategy = s.Strategy
		}
		if s.MPS != nil {
			if out.Sharing.MPS == nil {
				out.Sharing.MPS = &MPSConfig{}
			}
			if s.MPS.ComputePercent != nil {
				p := *s.MPS.ComputePercent
				out.Sharing.MPS.ComputePercent = &p
			}
		}
		if s.TimeSlicing != nil {
			if out.Sharing.TimeSlicing == nil {
				out.Sharing.TimeSlicing = &TimeSlicingConfig{}
			}
			if s.TimeSlicing.Interval != "" {
				out.Sharing.TimeSlicing.Interval = s.TimeSlicing.Interval
			}
		}
	}
	out.Default()
	return out
}

// ConfigForRequest returns the final config of one request of an allocated
// claim: the opaque configs of `driver` that apply to the request (no
// `requests` list, or one that names the request or, for a subrequest
// "parent/sub", its parent), class configs before claim configs, decoded,
// validated, merged, defaulted and validated again. Errors say which config
// entry and which field is wrong. No matching config gives the default
// (Exclusive) config.
func ConfigForRequest(driver string, configs []resourceapi.DeviceAllocationConfiguration, request string) (*GpuConfig, error) {
	var ordered []*GpuConfig
	sources := []struct {
		src  resourceapi.AllocationConfigSource
		name string
	}{{resourceapi.AllocationConfigSourceClass, "class"}, {resourceapi.AllocationConfigSourceClaim, "claim"}}
	for _, source := range sources {
		n := 0
		for _, cfg := range configs {
			if cfg.Source != source.src {
				continue
			}
			n++
			if cfg.Opaque == nil || cfg.Opaque.Driver != driver || !appliesTo(cfg.Requests, request) {
				continue
			}
			c, err := Parse(cfg.Opaque.Parameters.Raw)
			if err != nil {
				return nil, fmt.Errorf("%s config #%d for request %q: %w", source.name, n, request, err)
			}
			ordered = append(ordered, c)
		}
	}
	merged := Merge(ordered...)
	if err := merged.Validate(); err != nil {
		return nil, fmt.Errorf("merged config for request %q: %w", request, err)
	}
	return merged, nil
}

func appliesTo(requests []string, request string) bool {
	if len(requests) == 0 {
		return true
	}
	parent, _, _ := strings.Cut(request, "/")
	for _, r := range requests {
		if r == request || r == parent {
			return true
		}
	}
	return false
}

func oneOf[T ~string](v T, set []T) bool {
	for _, s := range set {
		if v == s {
			return true
		}
	}
	return false
}

func joinValues[T ~string](set []T) string {
	parts := make([]string, len(set))
	for i, s := range set {
		parts[i] = string(s)
	}
	return strings.Join(parts, "|")
}
