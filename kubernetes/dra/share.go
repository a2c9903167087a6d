package dra

import (
	"errors"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	sigsjson "sigs.k8s.io/json"

	"github.com/gpuiso/gpuiso/allocator"
)

// ShareConfig is the configuration of a share of a GPU that a DeviceClass
// or a claim may give the driver: the parameters of an opaque device
// configuration whose driver is this driver, as JSON (or YAML in the
// object). apiVersion and kind are optional; kind, when given, is
// "ShareConfig". Unknown fields are refused.
//
//	config:
//	- opaque:
//	    driver: gpu.gpuiso.io
//	    parameters: {kind: ShareConfig, computePercent: 50}
//
// The configurations that apply to a share's request (those naming no
// request, or naming it or its main request) are applied in the order the
// allocation lists them, the class's before the claim's: a later one's
// field overrides an earlier one's. It is read as the GPUConfig it means
// (sharing.mps.computePercent), beside the driver's versioned GPUConfig
// (see ParseDeviceConfig).
type ShareConfig struct {
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind,omitempty"`
	// ComputePercent is the part of the GPU's compute (MPS's active
	// thread percentage, 1 to 100) each process of the share may use; 0
	// means no limit.
	ComputePercent *int `json:"computePercent,omitempty"`
}

// ShareConfigKind is ShareConfig's kind.
const ShareConfigKind = "ShareConfig"

// ParseShareConfig reads the parameters of an opaque configuration as a
// ShareConfig and checks them. It decodes as strictly as
// ParseDeviceConfig does a GPUConfig: field names are case-sensitive, and
// an unknown or repeated field (a second kind) is refused.
func ParseShareConfig(b []byte) (ShareConfig, error) {
	var c ShareConfig
	strict, err := sigsjson.UnmarshalStrict(b, &c, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return ShareConfig{}, fmt.Errorf("share configuration: %w: %v", ErrInvalidShare, err)
	}
	if len(strict) > 0 {
		return ShareConfig{}, fmt.Errorf("share configuration: %w: %w", ErrInvalidShare, errors.Join(strict...))
	}
	if c.Kind != "" && c.Kind != ShareConfigKind {
		return ShareConfig{}, fmt.Errorf("share configuration: kind %q, want %s: %w", c.Kind, ShareConfigKind, ErrInvalidShare)
	}
	if p := c.ComputePercent; p != nil && (*p < 0 || *p > 100) {
		return ShareConfig{}, fmt.Errorf("share configuration: compute percentage %d, want 1 to 100 (0: no limit): %w", *p, ErrInvalidShare)
	}
	return c, nil
}

// shareOf is the share of r, a result allocating a share device, of the
// kind cfg (the configurations that apply to its request, configOf) asks
// for: a time slice (strategy TimeSlicing), a concurrent slice of
// mps.slices, or a memory share of the memory the scheduler gave it (its
// consumed capacity, the request rounded up by the request policy) and
// cfg's compute percentage. A time or concurrent slice's consumed memory
// is the scheduler's count alone: its GPU's allocator counts it as a slice.
func (d *Driver) shareOf(r resourceapi.DeviceRequestAllocationResult, cfg GPUConfig) (PreparedShare, error) {
	if r.ShareID == nil || *r.ShareID == "" {
		return PreparedShare{}, fmt.Errorf("a share allocated without a share id: %w", ErrInvalidShare)
	}
	// Each configuration was checked on its own; merged, a class's
	// compute percentage may meet a claim's slice count.
	if err := cfg.Validate(); err != nil {
		return PreparedShare{}, err
	}
	switch {
	case cfg.timeSliced():
		return PreparedShare{Mode: allocator.ShareTime}, nil
	case cfg.sliceCount() > 0:
		return PreparedShare{Mode: allocator.ShareSlice, Slices: cfg.sliceCount()}, nil
	}
	q, ok := r.ConsumedCapacity[CapMemory]
	if !ok {
		return PreparedShare{}, fmt.Errorf("a share allocated without consumed %s: %w", CapMemory, ErrInvalidShare)
	}
	mem, ok := q.AsInt64()
	if !ok || mem < 1<<20 {
		return PreparedShare{}, fmt.Errorf("a share of %s %s, want at least 1Mi: %w", q.String(), CapMemory, ErrInvalidShare)
	}
	return PreparedShare{MemoryBytes: uint64(mem), ComputePercent: cfg.computePercent()}, nil
}

func containsAny(list []string, vals ...string) bool {
	for _, l := range list {
		for _, v := range vals {
			if l == v {
				return true
			}
		}
	}
	return false
}
