package dra

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	sigsjson "sigs.k8s.io/json"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// GPUConfig is the driver's versioned opaque configuration of a request:
// the parameters of an opaque device configuration whose driver is this
// driver, in a DeviceClass or a claim. Its apiVersion is the driver's
// name (its API group) and a version, ConfigVersion; its kind GPUConfig:
//
//	config:
//	- requests: [gpus]
//	  opaque:
//	    driver: gpu.gpuiso.io
//	    parameters:
//	      apiVersion: gpu.gpuiso.io/v1
//	      kind: GPUConfig
//	      sharing:
//	        strategy: MPS
//	        mps: {computePercent: 50}
//	      mig:
//	        profiles: [1g.10gb, 2g.20gb]
//
// A request of a share device (the class share.gpuiso.io) is prepared as
// one of three kinds of share of its GPU, after its sharing: a memory
// share with an MPS daemon of its own (strategy MPS, or none; the
// default), a time slice (strategy TimeSlicing: the GPU whole beside its
// other time slices, no daemon) or a concurrent slice (strategy MPS with
// mps.slices N: one of N equal slices of the GPU under one MPS daemon
// that its slices share). A GPU holds shares of one kind at a time.
//
// It is decoded strictly: field names are case-sensitive, and an unknown
// or repeated field, a value of the wrong type, an unknown strategy, a
// compute percentage outside 0 to 100, a slice count outside
// allocator.MinSlices to allocator.MaxSlices, a slice count beside a
// compute percentage, MPS limits with strategy TimeSlicing or a malformed
// MIG profile is refused. Prepare reads every configuration of the driver that applies
// to a request it prepares (those naming no request, or naming it or its
// main request), the class's before the claim's, each set field
// overriding an earlier one's, and checks the result against the devices
// the request was allocated; a configuration that does not hold fails
// the claim's preparation with an error naming the field, which the
// kubelet reports as an event of the pod. ShareConfig, the older
// unversioned form, is still read (as sharing.mps.computePercent), as
// strictly; an object naming its kind (or apiVersion) twice is refused
// whatever the two say.
type GPUConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Sharing says how the request's devices are shared.
	Sharing *SharingConfig `json:"sharing,omitempty"`
	// MIG constrains the MIG devices the request accepts.
	MIG *MIGConfig `json:"mig,omitempty"`
}

// SharingStrategy is how a request's devices are shared.
type SharingStrategy string

// The sharing strategies.
const (
	// SharingExclusive: whole GPUs or MIG devices the claim holds alone
	// (the devices of the classes gpu.gpuiso.io and mig.gpuiso.io).
	SharingExclusive SharingStrategy = "Exclusive"
	// SharingMPS: a memory share of a GPU with an MPS control daemon of
	// its own (the devices of the class share.gpuiso.io), or, with
	// mps.slices, a concurrent slice of a GPU under the one MPS daemon
	// of its slices.
	SharingMPS SharingStrategy = "MPS"
	// SharingTimeSlicing: a time slice of a shared GPU (a device of the
	// class share.gpuiso.io): the GPU whole, beside its other time slices
	// (at most the node's time-slice count), isolated from none of them;
	// no MPS daemon.
	SharingTimeSlicing SharingStrategy = "TimeSlicing"
)

// SharingConfig is how a request's devices are shared. An empty strategy
// accepts whatever the request was allocated.
type SharingConfig struct {
	Strategy SharingStrategy `json:"strategy,omitempty"`
	// MPS are the limits of an MPS share (strategy MPS, or none).
	MPS *MPSConfig `json:"mps,omitempty"`
}

// MPSConfig are the limits of a memory share beyond its memory (which is
// the capacity the scheduler allocated it), or the count of a concurrent
// slice.
type MPSConfig struct {
	// ComputePercent is the part of the GPU's compute (MPS's active
	// thread percentage, 1 to 100) each process of the share may use; 0
	// means no limit.
	ComputePercent *int `json:"computePercent,omitempty"`
	// Slices, when set, makes the request a concurrent slice: one of
	// Slices equal slices of its GPU (allocator.MinSlices to
	// allocator.MaxSlices), held by the GPU's one MPS daemon to 1/Slices
	// of its memory and threads. A GPU split in N holds at most N slices,
	// all of count N.
	Slices *int `json:"slices,omitempty"`
}

// MIGConfig constrains a request's MIG devices.
type MIGConfig struct {
	// Profiles are the MIG profiles the request accepts, in order of
	// preference ("1g.10gb"): a MIG device of another profile is refused
	// when the claim is prepared. Empty accepts any.
	Profiles []string `json:"profiles,omitempty"`
}

// GPUConfigKind is GPUConfig's kind, ConfigVersion its version.
const (
	GPUConfigKind = "GPUConfig"
	ConfigVersion = "v1"
)

// migProfile is a MIG profile's name: "1g.10gb", "1g.10gb+me",
// "1c.2g.20gb", "1g.24gb+me.all".
var migProfile = regexp.MustCompile(`^([1-9][0-9]?c\.)?[1-9][0-9]?g\.[1-9][0-9]*gb(\+[a-z]+(\.[a-z]+)*)?$`)

// ParseDeviceConfig reads the parameters of an opaque configuration of
// driver (DefaultDriverName when empty): a GPUConfig of apiVersion
// "<driver>/v1", or a ShareConfig (kind ShareConfig or none), which it
// returns as the GPUConfig it means. Errors match ErrInvalidDeviceConfig.
func ParseDeviceConfig(driver string, b []byte) (GPUConfig, error) {
	if driver == "" {
		driver = DefaultDriverName
	}
	// The head is read as strictly as the rest: a repeated apiVersion or
	// kind is refused here, so that no form is chosen by the last of two.
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	strict, err := sigsjson.UnmarshalStrict(b, &head, sigsjson.DisallowDuplicateFields)
	if err != nil {
		return GPUConfig{}, configErr("", "", err)
	}
	if len(strict) > 0 {
		return GPUConfig{}, configErr(head.Kind, "", errors.Join(strict...))
	}
	switch head.Kind {
	case GPUConfigKind:
	case "", ShareConfigKind:
		sc, err := ParseShareConfig(b)
		if err != nil {
			return GPUConfig{}, configErr(ShareConfigKind, "", err)
		}
		c := GPUConfig{APIVersion: driver + "/" + ConfigVersion, Kind: GPUConfigKind}
		if sc.ComputePercent != nil {
			c.Sharing = &SharingConfig{MPS: &MPSConfig{ComputePercent: sc.ComputePercent}}
		}
		return c, nil
	default:
		return GPUConfig{}, configErr(head.Kind, "kind", fmt.Errorf("unknown kind, want %s (or %s)", GPUConfigKind, ShareConfigKind))
	}
	if want := driver + "/" + ConfigVersion; head.APIVersion != want {
		group, _, _ := strings.Cut(head.APIVersion, "/")
		if group == driver {
			return GPUConfig{}, configErr(GPUConfigKind, "apiVersion", fmt.Errorf("version %q is not known, want %s", head.APIVersion, want))
		}
		return GPUConfig{}, configErr(GPUConfigKind, "apiVersion", fmt.Errorf("%q, want %s", head.APIVersion, want))
	}
	var c GPUConfig
	strict, err = sigsjson.UnmarshalStrict(b, &c, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return GPUConfig{}, configErr(GPUConfigKind, "", err)
	}
	if len(strict) > 0 {
		return GPUConfig{}, configErr(GPUConfigKind, "", errors.Join(strict...))
	}
	return c, c.Validate()
}

// Validate checks the values of c's fields.
func (c GPUConfig) Validate() error {
	if s := c.Sharing; s != nil {
		switch s.Strategy {
		case "", SharingExclusive, SharingMPS, SharingTimeSlicing:
		default:
			return configErr(GPUConfigKind, "sharing.strategy", fmt.Errorf("%q, want %s, %s or %s", s.Strategy, SharingExclusive, SharingMPS, SharingTimeSlicing))
		}
		if s.MPS != nil && (s.Strategy == SharingExclusive || s.Strategy == SharingTimeSlicing) {
			return configErr(GPUConfigKind, "sharing.mps", fmt.Errorf("limits of an MPS share with strategy %s", s.Strategy))
		}
		if s.MPS != nil && s.MPS.ComputePercent != nil {
			if p := *s.MPS.ComputePercent; p < 0 || p > 100 {
				return configErr(GPUConfigKind, "sharing.mps.computePercent", fmt.Errorf("%d, want 1 to 100 (0: no limit)", p))
			}
		}
		if s.MPS != nil && s.MPS.Slices != nil {
			if n := *s.MPS.Slices; n < allocator.MinSlices || n > allocator.MaxSlices {
				return configErr(GPUConfigKind, "sharing.mps.slices", fmt.Errorf("%d, want %d to %d", n, allocator.MinSlices, allocator.MaxSlices))
			}
			if s.MPS.ComputePercent != nil && *s.MPS.ComputePercent != 0 {
				return configErr(GPUConfigKind, "sharing.mps.slices", fmt.Errorf("a concurrent slice beside a compute percentage (a slice has 1/%d of the GPU's threads)", *s.MPS.Slices))
			}
		}
	}
	if m := c.MIG; m != nil {
		for i, p := range m.Profiles {
			if !migProfile.MatchString(p) {
				return configErr(GPUConfigKind, fmt.Sprintf("mig.profiles[%d]", i), fmt.Errorf("%q is not a MIG profile (like 1g.10gb)", p))
			}
			if slices.Index(m.Profiles, p) != i {
				return configErr(GPUConfigKind, fmt.Sprintf("mig.profiles[%d]", i), fmt.Errorf("%q named twice", p))
			}
		}
	}
	return nil
}

// merge sets c's fields that o sets to o's.
func (c *GPUConfig) merge(o GPUConfig) {
	if s := o.Sharing; s != nil {
		if c.Sharing == nil {
			c.Sharing = &SharingConfig{}
		}
		if s.Strategy != "" {
			c.Sharing.Strategy = s.Strategy
		}
		if m := s.MPS; m != nil && (m.ComputePercent != nil || m.Slices != nil) {
			if c.Sharing.MPS == nil {
				c.Sharing.MPS = &MPSConfig{}
			}
			if m.ComputePercent != nil {
				c.Sharing.MPS.ComputePercent = m.ComputePercent
			}
			if m.Slices != nil {
				c.Sharing.MPS.Slices = m.Slices
			}
		}
	}
	if o.MIG != nil && o.MIG.Profiles != nil {
		c.MIG = &MIGConfig{Profiles: o.MIG.Profiles}
	}
}

// computePercent is the MPS compute percentage c asks for (0: none).
func (c GPUConfig) computePercent() int {
	if c.Sharing != nil && c.Sharing.MPS != nil && c.Sharing.MPS.ComputePercent != nil {
		return *c.Sharing.MPS.ComputePercent
	}
	return 0
}

// sliceCount is the concurrent slice count c asks for (0: none).
func (c GPUConfig) sliceCount() int {
	if c.Sharing != nil && c.Sharing.MPS != nil && c.Sharing.MPS.Slices != nil {
		return *c.Sharing.MPS.Slices
	}
	return 0
}

// timeSliced reports whether c asks for a time slice.
func (c GPUConfig) timeSliced() bool {
	return c.Sharing != nil && c.Sharing.Strategy == SharingTimeSlicing
}

// ConfigError is an opaque configuration that cannot be used.
type ConfigError struct {
	// Kind is the configuration's kind, when known.
	Kind string
	// Field is the field at fault ("sharing.strategy"), when known.
	Field string
	Err   error
}

func (e *ConfigError) Error() string {
	what := "opaque configuration"
	if e.Kind != "" {
		what += " " + e.Kind
	}
	if e.Field != "" {
		what += ": " + e.Field
	}
	return fmt.Sprintf("%s: %v", what, e.Err)
}

// Is matches ErrInvalidDeviceConfig and node.ErrInvalid.
func (e *ConfigError) Is(target error) bool {
	return target == ErrInvalidDeviceConfig || target == node.ErrInvalid
}

// Unwrap returns the reason.
func (e *ConfigError) Unwrap() error { return e.Err }

func configErr(kind, field string, err error) error {
	return &ConfigError{Kind: kind, Field: field, Err: err}
}

// configOf is the configuration of result r of claim: every opaque
// configuration of this driver that applies to its request, merged in
// the allocation's order (the class's before the claim's). Each is read
// and checked; the first that does not read is the error.
func (d *Driver) configOf(claim *resourceapi.ResourceClaim, r resourceapi.DeviceRequestAllocationResult) (GPUConfig, error) {
	var out GPUConfig
	parent, _, _ := strings.Cut(r.Request, "/")
	for _, c := range claim.Status.Allocation.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != d.cfg.DriverName {
			continue
		}
		if len(c.Requests) > 0 && !containsAny(c.Requests, r.Request, parent) {
			continue
		}
		gc, err := ParseDeviceConfig(d.cfg.DriverName, c.Opaque.Parameters.Raw)
		if err != nil {
			return GPUConfig{}, fmt.Errorf("%s configuration of request %s: %w", sourceName(c.Source), r.Request, err)
		}
		out.merge(gc)
	}
	return out, nil
}

// sourceName is where a configuration comes from, in words.
func sourceName(s resourceapi.AllocationConfigSource) string {
	switch s {
	case resourceapi.AllocationConfigSourceClass:
		return "the class's"
	case resourceapi.AllocationConfigSourceClaim:
		return "the claim's"
	}
	return "a"
}

// checkConfig checks that c holds for device, allocated to request: a
// share ("share"), a whole GPU ("gpu") or a MIG device ("mig") of profile.
func checkConfig(c GPUConfig, request, device, typ, profile string) error {
	fail := func(field string, err error) error {
		return fmt.Errorf("request %s allocated %s: %w", request, device, configErr(GPUConfigKind, field, err))
	}
	if s := c.Sharing; s != nil {
		switch {
		case s.Strategy == SharingExclusive && typ == "share":
			return fail("sharing.strategy", fmt.Errorf("%s, but the device is a memory share of a GPU", SharingExclusive))
		case s.Strategy == SharingMPS && typ != "share":
			return fail("sharing.strategy", fmt.Errorf("%s needs a memory share (a device of type share), the device is a whole %s", SharingMPS, strings.ToUpper(typ)))
		case s.Strategy == SharingTimeSlicing && typ != "share":
			return fail("sharing.strategy", fmt.Errorf("%s needs a shared GPU (a device of type share), the device is a whole %s", SharingTimeSlicing, strings.ToUpper(typ)))
		case s.MPS != nil && (s.MPS.ComputePercent != nil || s.MPS.Slices != nil) && typ != "share":
			return fail("sharing.mps", fmt.Errorf("limits of an MPS share, the device is a whole %s", strings.ToUpper(typ)))
		}
	}
	if m := c.MIG; m != nil && len(m.Profiles) > 0 && typ == "mig" && !slices.Contains(m.Profiles, profile) {
		return fail("mig.profiles", fmt.Errorf("the device is a MIG device of profile %s, not one of %v", profile, m.Profiles))
	}
	return nil
}

// deviceType is the type ("gpu", "mig") and MIG profile of the device
// named name in the slice, from the inventory; ok is false for a name
// that is neither.
func (d *Driver) deviceType(name string) (typ, profile string, ok bool) {
	for _, dev := range d.inv.Devices {
		if !dev.MIGSplit() {
			if DeviceName(dev) == name {
				return "gpu", "", true
			}
			continue
		}
		for _, m := range dev.MIGDevices {
			if MIGDeviceName(m) == name {
				return "mig", m.Profile, true
			}
		}
	}
	return "", "", false
}
