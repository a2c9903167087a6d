package dockerconfig_test

import (
	"testing"

	"github.com/moby/moby/api/types/container"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/dockerconfig"
)

// TestCPUs: a plan that pins its container sets the host config's cpuset;
// one that does not leaves the caller's.
func TestCPUs(t *testing.T) {
	for _, tc := range []struct {
		name             string
		plan             isolator.Plan
		have, cpus, mems string
	}{
		{name: "pinned", plan: isolator.Plan{Owner: "a", CPUs: "4-7", Mems: "1"}, cpus: "4-7", mems: "1"},
		{name: "pinned over the caller's", plan: isolator.Plan{Owner: "a", CPUs: "0-3", Mems: "0"}, have: "1", cpus: "0-3", mems: "0"},
		{name: "not pinned", plan: isolator.Plan{Owner: "a"}, have: "2", cpus: "2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := dockerconfig.New(&tc.plan)
			if err != nil {
				t.Fatal(err)
			}
			hc := &container.HostConfig{}
			hc.CpusetCpus = tc.have
			if err := c.Apply(&container.Config{}, hc); err != nil {
				t.Fatal(err)
			}
			if hc.CpusetCpus != tc.cpus || hc.CpusetMems != tc.mems {
				t.Fatalf("cpuset %q/%q, want %q/%q", hc.CpusetCpus, hc.CpusetMems, tc.cpus, tc.mems)
			}
		})
	}
}
