package allocator_test

import (
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

func v100() *node.Device {
	return &node.Device{
		Index: 3, Minor: 3, UUID: "GPU-1", BusID: "0000:0b:00.0", Model: "Tesla V100-SXM2-16GB", Brand: "Tesla",
		Architecture: "volta", ComputeCapability: "7.0", MemoryBytes: 16 << 30, NUMANode: 0,
		Attributes: node.Attributes{
			node.AttrMemory:          node.IntAttribute(16384, node.UnitMiB),
			node.AttrPower:           node.IntAttribute(300, node.UnitW),
			node.AttrCoresClock:      node.IntAttribute(1530, node.UnitMHz),
			node.AttrDriverVersion:   node.StringAttribute("535.104.05"),
			node.AttrPersistenceMode: node.StringAttribute("Enabled"),
			"ecc":                    node.BoolAttribute(true),
			"features":               node.StringAttribute("nvlink,ecc,mps"),
		},
	}
}

func TestConstraintMatches(t *testing.T) {
	d := v100()
	tests := []struct {
		in   string
		want bool
	}{
		{"memory >= 16 GiB", true},
		{"memory > 16 GiB", false},
		{"memory = 16384", true},
		{"memory = 16384 MiB", true},
		{"memory < 17179869185 B", true},
		{"memory >= 17 GB", true}, // 16 GiB is 17.18 GB
		{"memory >= 18 GB", false},
		{"memory >= 4 W", false}, // another dimension never matches
		{"power <= 0.3 kW", true},
		{"cores_clock > 1.5 GHz", true},
		{"${device.attr.memory} >= 8GiB", true},
		{"${device.model} = Tesla V100-SXM2-16GB", true},
		{"model != Tesla V100-SXM2-16GB", false},
		{"model regexp V100", true},
		{"model regexp ^A100", false},
		{"driver_version version >= 535, < 550", true},
		{"driver_version version >= 535.104.6", false},
		{"compute_capability version >= 7.0", true},
		{"compute_capability >= 8.0", false},
		{"brand = Tesla", true},
		{"architecture = volta", true},
		{"numa_node = 0", true},
		{"index > 2", true},
		{"ecc = true", true},
		{"ecc = false", false},
		{"features set_contains nvlink,mps", true},
		{"features set_contains nvswitch", false},
		{"mig is_not_set", true},
		{"memory is_set", true},
		{"bar1 is_set", false},
		{"bar1 >= 1", false},
		{"persistence_mode = Enabled", true},
	}
	for _, tt := range tests {
		c, err := allocator.ParseConstraint(tt.in)
		if err != nil {
			t.Errorf("%q: %v", tt.in, err)
			continue
		}
		if got := c.Matches(d); got != tt.want {
			t.Errorf("%q on V100: %v, want %v", tt.in, got, tt.want)
		}
		back, err := allocator.ParseConstraint(c.String())
		if err != nil || back != c {
			t.Errorf("%q does not round-trip: %q %v", tt.in, c.String(), err)
		}
	}
}

func TestConstraintParseErrors(t *testing.T) {
	for _, in := range []string{"", "memory", "memory ~ 4", "memory >=", "model regexp (", "mig is_set x",
		"driver_version version >= x", "= 4"} {
		_, err := allocator.ParseConstraint(in)
		if !errors.Is(err, allocator.ErrInvalidConstraint) {
			t.Errorf("%q: err = %v", in, err)
		}
	}
	a := allocator.Affinity{Constraint: allocator.Constraint{Attribute: "model", Operator: "=", Value: "x"}, Weight: 0}
	if err := a.Validate(); !errors.Is(err, allocator.ErrInvalidConstraint) {
		t.Errorf("zero weight: %v", err)
	}
	a.Weight = -100
	if err := a.Validate(); err != nil {
		t.Errorf("weight -100: %v", err)
	}
}
