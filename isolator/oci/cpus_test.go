package oci_test

import (
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/oci"
)

// TestApplyCPUs: a plan that pins its container sets the spec's cpuset
// (keeping the spec's other CPU settings); one that does not leaves it.
func TestApplyCPUs(t *testing.T) {
	shares := uint64(512)
	spec := &specs.Spec{Linux: &specs.Linux{Resources: &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: &shares, Cpus: "0-7"}}}}
	if err := oci.Apply(spec, &isolator.Plan{Owner: "a"}); err != nil {
		t.Fatal(err)
	}
	if c := spec.Linux.Resources.CPU; c.Cpus != "0-7" || c.Mems != "" {
		t.Fatalf("a plan without CPUs changed the cpuset: %+v", c)
	}
	if err := oci.Apply(spec, &isolator.Plan{Owner: "a", CPUs: "4-5", Mems: "1"}); err != nil {
		t.Fatal(err)
	}
	if c := spec.Linux.Resources.CPU; c.Cpus != "4-5" || c.Mems != "1" || c.Shares == nil || *c.Shares != 512 {
		t.Fatalf("cpuset %+v, want cpus 4-5, mems 1 and the shares kept", c)
	}
	bare := &specs.Spec{Linux: &specs.Linux{}}
	if err := oci.Apply(bare, &isolator.Plan{Owner: "a", CPUs: "0", Mems: "0"}); err != nil {
		t.Fatal(err)
	}
	if c := bare.Linux.Resources.CPU; c == nil || c.Cpus != "0" || c.Mems != "0" {
		t.Fatalf("cpuset %+v, want cpus 0, mems 0", c)
	}
}
