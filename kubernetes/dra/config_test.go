package dra_test

import (
	"errors"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpuiso/gpuiso/kubernetes/dra"
	"github.com/gpuiso/gpuiso/node"
)

// TestParseDeviceConfig: a GPUConfig is decoded strictly (case-sensitive
// names, no unknown or repeated field, its own apiVersion) and its values
// checked; a ShareConfig still reads, as the GPUConfig it means.
func TestParseDeviceConfig(t *testing.T) {
	const head = `"apiVersion":"gpu.gpuiso.io/v1","kind":"GPUConfig"`
	good := []struct {
		name, in       string
		strategy       dra.SharingStrategy
		compute        int
		slices         int
		profiles       []string
		noSharing, mig bool
	}{
		{name: "empty", in: `{` + head + `}`, noSharing: true},
		{name: "mps", in: `{` + head + `,"sharing":{"strategy":"MPS","mps":{"computePercent":50}}}`, strategy: dra.SharingMPS, compute: 50},
		{name: "exclusive", in: `{` + head + `,"sharing":{"strategy":"Exclusive"}}`, strategy: dra.SharingExclusive},
		{name: "time slicing", in: `{` + head + `,"sharing":{"strategy":"TimeSlicing"}}`, strategy: dra.SharingTimeSlicing},
		{name: "concurrent slices", in: `{` + head + `,"sharing":{"strategy":"MPS","mps":{"slices":4}}}`, strategy: dra.SharingMPS, slices: 4},
		{name: "48 slices, no compute", in: `{` + head + `,"sharing":{"mps":{"slices":48,"computePercent":0}}}`, slices: 48},
		{name: "mig", in: `{` + head + `,"mig":{"profiles":["1g.10gb","2g.20gb","1g.10gb+me","1c.2g.20gb"]}}`, noSharing: true, mig: true,
			profiles: []string{"1g.10gb", "2g.20gb", "1g.10gb+me", "1c.2g.20gb"}},
		{name: "share config", in: `{"kind":"ShareConfig","computePercent":40}`, compute: 40},
		{name: "share config without kind", in: `{"computePercent":30}`, compute: 30},
		{name: "share config without limit", in: `{}`, noSharing: true},
	}
	for _, tt := range good {
		t.Run(tt.name, func(t *testing.T) {
			c, err := dra.ParseDeviceConfig("", []byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if c.APIVersion != "gpu.gpuiso.io/v1" || c.Kind != "GPUConfig" {
				t.Errorf("apiVersion %q kind %q", c.APIVersion, c.Kind)
			}
			if (c.Sharing == nil) != tt.noSharing {
				t.Fatalf("sharing %+v", c.Sharing)
			}
			if s := c.Sharing; s != nil {
				got, n := 0, 0
				if s.MPS != nil && s.MPS.ComputePercent != nil {
					got = *s.MPS.ComputePercent
				}
				if s.MPS != nil && s.MPS.Slices != nil {
					n = *s.MPS.Slices
				}
				if s.Strategy != tt.strategy || got != tt.compute || n != tt.slices {
					t.Errorf("strategy %q compute %d slices %d, want %q %d %d", s.Strategy, got, n, tt.strategy, tt.compute, tt.slices)
				}
			}
			if (c.MIG != nil) != tt.mig || (c.MIG != nil && strings.Join(c.MIG.Profiles, " ") != strings.Join(tt.profiles, " ")) {
				t.Errorf("mig %+v, want %v", c.MIG, tt.profiles)
			}
		})
	}
	bad := []struct{ name, in, want string }{
		{"unknown field", `{` + head + `,"sharing":{"strategy":"MPS","replicas":4}}`, `unknown field "sharing.replicas"`},
		{"unknown top field", `{` + head + `,"timeSlicing":{}}`, `unknown field "timeSlicing"`},
		{"field of another case", `{` + head + `,"Sharing":{"strategy":"MPS"}}`, `unknown field "Sharing"`},
		{"repeated field", `{` + head + `,"mig":{},"mig":{}}`, `duplicate field "mig"`},
		{"wrong type", `{` + head + `,"sharing":{"mps":{"computePercent":"50"}}}`, "computePercent"},
		{"bad strategy", `{` + head + `,"sharing":{"strategy":"Replicas"}}`, `sharing.strategy: "Replicas", want Exclusive, MPS or TimeSlicing`},
		{"strategy of another case", `{` + head + `,"sharing":{"strategy":"timeSlicing"}}`, `sharing.strategy: "timeSlicing"`},
		{"one slice", `{` + head + `,"sharing":{"strategy":"MPS","mps":{"slices":1}}}`, "sharing.mps.slices: 1, want 2 to 48"},
		{"49 slices", `{` + head + `,"sharing":{"mps":{"slices":49}}}`, "sharing.mps.slices: 49, want 2 to 48"},
		{"slices and compute", `{` + head + `,"sharing":{"mps":{"slices":4,"computePercent":50}}}`, "sharing.mps.slices: a concurrent slice beside a compute percentage"},
		{"mps limits when time sliced", `{` + head + `,"sharing":{"strategy":"TimeSlicing","mps":{"slices":4}}}`, "sharing.mps: limits of an MPS share with strategy TimeSlicing"},
		{"slices of the wrong type", `{` + head + `,"sharing":{"mps":{"slices":"4"}}}`, "slices"},
		{"compute over 100", `{` + head + `,"sharing":{"mps":{"computePercent":150}}}`, "sharing.mps.computePercent: 150, want 1 to 100"},
		{"negative compute", `{` + head + `,"sharing":{"mps":{"computePercent":-1}}}`, "sharing.mps.computePercent: -1"},
		{"mps limits when exclusive", `{` + head + `,"sharing":{"strategy":"Exclusive","mps":{"computePercent":10}}}`, "sharing.mps"},
		{"bad profile", `{` + head + `,"mig":{"profiles":["1g.10gb","big"]}}`, `mig.profiles[1]: "big" is not a MIG profile`},
		{"profile twice", `{` + head + `,"mig":{"profiles":["1g.10gb","1g.10gb"]}}`, "named twice"},
		{"no apiVersion", `{"kind":"GPUConfig"}`, `apiVersion: "", want gpu.gpuiso.io/v1`},
		{"unknown version", `{"apiVersion":"gpu.gpuiso.io/v2","kind":"GPUConfig"}`, `version "gpu.gpuiso.io/v2" is not known`},
		{"another group", `{"apiVersion":"gpu.example.com/v1","kind":"GPUConfig"}`, `apiVersion: "gpu.example.com/v1"`},
		{"unknown kind", `{"apiVersion":"gpu.gpuiso.io/v1","kind":"GpuConfig"}`, `kind: unknown kind`},
		{"not an object", `[1]`, "opaque configuration"},
		{"bad share config", `{"kind":"ShareConfig","computePercent":101}`, "compute percentage 101"},
		// One object, one kind: a second kind is refused whichever comes
		// last, and no form is read by a laxer decoder.
		{"second kind, share last", `{` + head + `,"kind":"ShareConfig","computePercent":50}`, `duplicate field "kind"`},
		{"second kind, gpu last", `{"kind":"ShareConfig",` + head + `}`, `duplicate field "kind"`},
		{"share config twice", `{"kind":"ShareConfig","kind":"ShareConfig"}`, `duplicate field "kind"`},
		{"share field twice", `{"kind":"ShareConfig","computePercent":10,"computePercent":90}`, `duplicate field "computePercent"`},
		{"share field of another case", `{"kind":"ShareConfig","ComputePercent":90}`, `unknown field "ComputePercent"`},
		{"kind of another case", `{"Kind":"ShareConfig","computePercent":90}`, `unknown field "Kind"`},
		{"apiVersion twice", `{"apiVersion":"gpu.example.com/v1",` + head + `}`, `duplicate field "apiVersion"`},
		{"data after the object", `{"kind":"ShareConfig"} {}`, "opaque configuration"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := dra.ParseDeviceConfig("gpu.gpuiso.io", []byte(tt.in))
			if !errors.Is(err, dra.ErrInvalidDeviceConfig) || !errors.Is(err, node.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want ErrInvalidDeviceConfig with %q", err, tt.want)
			}
		})
	}
	// Another driver name is another group.
	if _, err := dra.ParseDeviceConfig("gpu.example.com", []byte(`{`+head+`}`)); !errors.Is(err, dra.ErrInvalidDeviceConfig) {
		t.Errorf("gpu.gpuiso.io/v1 for driver gpu.example.com: %v", err)
	}
	if _, err := dra.ParseDeviceConfig("gpu.example.com", []byte(`{"apiVersion":"gpu.example.com/v1","kind":"GPUConfig"}`)); err != nil {
		t.Errorf("gpu.example.com/v1 for driver gpu.example.com: %v", err)
	}
}

// withConfig adds opaque configurations of the driver to c's allocation,
// the first the class's and the others the claim's, each for requests
// (all when nil).
func withConfig(c *resourceapi.ResourceClaim, requests []string, params ...string) *resourceapi.ResourceClaim {
	for i, p := range params {
		src := resourceapi.AllocationConfigSourceClass
		if i > 0 {
			src = resourceapi.AllocationConfigSourceClaim
		}
		c.Status.Allocation.Devices.Config = append(c.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
			Source: src, Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: dra.DefaultDriverName, Parameters: runtime.RawExtension{Raw: []byte(p)},
			}},
		})
	}
	return c
}

// TestPrepareConfig: Prepare checks the configurations that apply to each
// request against its devices: a bad one, or one that does not hold for
// the device (MPS for a whole GPU, a MIG device of a profile not
// accepted), fails the claim with an error naming the field, and leaves
// nothing; one for another request, or another driver, is not read.
func TestPrepareConfig(t *testing.T) {
	e := newEnv(t, "hgx-h100-mig")
	d, a := e.driver(t)
	var gpu string
	for _, dev := range e.inv.Devices {
		if !dev.MIGSplit() {
			gpu = dra.DeviceName(dev)
			break
		}
	}
	mig := dra.MIGDeviceName(firstMIG(e.inv, "1g.10gb"))
	const head = `"apiVersion":"gpu.gpuiso.io/v1","kind":"GPUConfig"`
	ok := []struct {
		name  string
		claim *resourceapi.ResourceClaim
	}{
		{"exclusive GPU", withConfig(claim("ok1", gpu), nil, `{`+head+`,"sharing":{"strategy":"Exclusive"}}`)},
		{"accepted profile", withConfig(claim("ok2", mig), nil, `{`+head+`,"mig":{"profiles":["2g.20gb","1g.10gb"]}}`)},
		{"claim over class", withConfig(claim("ok3", mig), nil, `{`+head+`,"mig":{"profiles":["2g.20gb"]}}`, `{`+head+`,"mig":{"profiles":["1g.10gb"]}}`)},
		{"another request's", withConfig(claim("ok4", gpu), []string{"other"}, `{`+head+`,"sharing":{"strategy":"MPS"}}`)},
	}
	for _, tt := range ok {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := d.Prepare(t.Context(), tt.claim); err != nil {
				t.Fatal(err)
			}
			if err := d.Unprepare(t.Context(), string(tt.claim.UID)); err != nil {
				t.Fatal(err)
			}
		})
	}
	other := claim("ok5", gpu)
	other.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClaim,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: "gpu.example.com", Parameters: runtime.RawExtension{Raw: []byte(`{"anything":1}`)}}}}}
	if _, err := d.Prepare(t.Context(), other); err != nil {
		t.Errorf("another driver's configuration: %v", err)
	}
	d.Unprepare(t.Context(), "ok5")

	bad := []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{"unknown field", withConfig(claim("b1", gpu), nil, `{`+head+`,"sharing":{"strategy":"Exclusive","gpus":2}}`),
			`prepare claim ns/claim-b1: device "` + gpu + `": the class's configuration of request r0: opaque configuration GPUConfig: unknown field "sharing.gpus"`},
		{"bad value in the claim's", withConfig(claim("b2", gpu), []string{"r0"}, `{`+head+`}`, `{`+head+`,"sharing":{"mps":{"computePercent":300}}}`),
			"the claim's configuration of request r0: opaque configuration GPUConfig: sharing.mps.computePercent: 300, want 1 to 100"},
		{"MPS on a whole GPU", withConfig(claim("b3", gpu), nil, `{`+head+`,"sharing":{"strategy":"MPS"}}`),
			"request r0 allocated " + gpu + ": opaque configuration GPUConfig: sharing.strategy: MPS needs a memory share"},
		{"MPS limits on a whole GPU", withConfig(claim("b4", gpu), nil, `{"kind":"ShareConfig","computePercent":20}`),
			"sharing.mps: limits of an MPS share, the device is a whole GPU"},
		{"profile not accepted", withConfig(claim("b5", mig), nil, `{`+head+`,"mig":{"profiles":["3g.40gb"]}}`),
			"mig.profiles: the device is a MIG device of profile 1g.10gb, not one of [3g.40gb]"},
		{"second device's request", withConfig(claim("b6", gpu, mig), []string{"r1"}, `{`+head+`,"mig":{"profiles":["7g.80gb"]}}`),
			"mig.profiles"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := d.Prepare(t.Context(), tt.claim)
			if !errors.Is(err, dra.ErrInvalidDeviceConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalidDeviceConfig with %q", err, tt.want)
			}
			var ce *dra.ConfigError
			if !errors.As(err, &ce) || ce.Kind != dra.GPUConfigKind || ce.Field == "" && !strings.Contains(tt.want, "unknown field") {
				t.Errorf("ConfigError %+v", ce)
			}
			uids, _ := d.Prepared()
			if len(uids) != 0 {
				t.Errorf("checkpoints left: %v", uids)
			}
			if als := a.Allocations(); len(als) != 0 {
				t.Errorf("allocator holds %v", als)
			}
		})
	}
}
