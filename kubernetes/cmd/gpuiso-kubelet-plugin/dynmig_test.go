package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// TestDynamicMIGFlag: --dynamic-mig is refused without the DRA driver and
// beside the device plugin; with a MIG manager it partitions every GPU
// with MIG enabled and gives the allocator the manager; without the flag
// nothing is partitioned.
func TestDynamicMIGFlag(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		refusedBy string
	}{
		{name: "DRA only", args: []string{"--kubeconfig", "k", "--dynamic-mig"}},
		{name: "with the device plugin", args: []string{"--kubeconfig", "k", "--device-plugin", "--resource-name", "nvidia.com/gpu.dp", "--dynamic-mig"},
			refusedBy: "--dynamic-mig and the device plugin"},
		{name: "without DRA", args: []string{"--kubeconfig", "k", "--dra=false", "--dynamic-mig"}, refusedBy: "--dynamic-mig needs the DRA driver"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			_, code, done := parse(tt.args, &out)
			if tt.refusedBy != "" {
				if !done || code != 2 || !strings.Contains(out.String(), tt.refusedBy) {
					t.Errorf("parse = %d, %v, %q; want refused with %q", code, done, out.String(), tt.refusedBy)
				}
				return
			}
			if done {
				t.Fatalf("refused: %s", out.String())
			}
		})
	}

	sim, err := simnode.New("hgx-h100-dynmig")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(sim.NVML()), nvmlnode.WithDevRoot(dir), nvmlnode.WithProcRoot(dir), nvmlnode.WithSysRoot(dir))
	if err != nil {
		t.Fatal(err)
	}
	m := migFlags{dynamic: true, manager: sim.MIGManager(nil)}
	if got := m.gpus(inv); !slices.Equal(got, []string{sim.UUID(0), sim.UUID(1)}) || len(m.options()) != 1 {
		t.Errorf("partitioned %v, %d allocator options", got, len(m.options()))
	}
	m.dynamic = false
	if got := m.gpus(inv); got != nil || m.options() != nil {
		t.Errorf("without --dynamic-mig: partitioned %v", got)
	}
}
