package dra_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/kubernetes/dra"
)

// FuzzParseDeviceConfig: any bytes give a configuration or an error that
// matches ErrInvalidDeviceConfig, never a panic; an accepted one is valid,
// of the driver's version and kind, and reads back as the same JSON once written.
func FuzzParseDeviceConfig(f *testing.F) {
	for _, s := range []string{
		`{"apiVersion":"gpu.gpuiso.io/v1","kind":"GPUConfig","sharing":{"strategy":"MPS","mps":{"computePercent":50}},"mig":{"profiles":["1g.10gb"]}}`,
		`{"apiVersion":"gpu.gpuiso.io/v1","kind":"GPUConfig","sharing":{"strategy":"Exclusive"}}`,
		`{"apiVersion":"gpu.gpuiso.io/v1","kind":"GPUConfig","mig":{"profiles":["1c.2g.20gb","1g.10gb+me"]}}`,
		`{"kind":"ShareConfig","computePercent":40}`,
		`{"computePercent":0}`,
		`{"apiVersion":"gpu.gpuiso.io/v1","kind":"GPUConfig","mig":{},"mig":{}}`,
		`{"apiVersion":"gpu.gpuiso.io/v2","kind":"GPUConfig"}`,
		`{"kind":"Other"}`,
		`[]`, `{`, `null`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := dra.ParseDeviceConfig("", b)
		if err != nil {
			if !errors.Is(err, dra.ErrInvalidDeviceConfig) {
				t.Fatalf("error %v does not match ErrInvalidDeviceConfig", err)
			}
			return
		}
		if c.APIVersion != "gpu.gpuiso.io/v1" || c.Kind != dra.GPUConfigKind {
			t.Fatalf("accepted %q %q", c.APIVersion, c.Kind)
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted an invalid configuration: %v", err)
		}
		out, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		again, err := dra.ParseDeviceConfig("", out)
		if err != nil {
			t.Fatalf("%s does not read back: %v", out, err)
		}
		out2, err := json.Marshal(again)
		if err != nil {
			t.Fatal(err)
		}
		if string(out2) != string(out) {
			t.Fatalf("%s reads back as %s", out, out2)
		}
	})
}
