package allocator_test

import (
	"context"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
)

func TestRetain(t *testing.T) {
	ctx := context.Background()
	inv := simInv(t, "dgx1-volta")
	a, err := allocator.New(inv, allocator.WithStateDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(ctx, "job", allocator.Request{Devices: []string{"1", "2", "3"}}); err != nil {
		t.Fatal(err)
	}
	for name, keep := range map[string][]string{
		"nothing":       nil,
		"not held":      {"1", "5"},
		"duplicate":     {"1", "1"},
		"unknown":       {"42"},
		"unknown owner": {"1"},
	} {
		t.Run(name, func(t *testing.T) {
			owner := "job"
			if name == "unknown owner" {
				owner = "nobody"
			}
			if _, err := a.Retain(ctx, owner, keep); err == nil {
				t.Fatalf("Retain(%v) succeeded", keep)
			}
			if al, _ := a.Allocation("job"); len(al.Devices) != 3 {
				t.Fatalf("a refused Retain changed the allocation to %v", al.Devices)
			}
		})
	}
	al, err := a.Retain(ctx, "job", []string{inv.Devices[3].UUID, "1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(al.Devices) != 2 || al.Devices[0].Index != 1 || al.Devices[1].Index != 3 {
		t.Fatalf("kept %v, want GPUs 1 and 3", al.Devices)
	}
	if owners, _ := a.Owners("2"); len(owners) != 0 {
		t.Fatalf("GPU 2 still owned by %v", owners)
	}
	if _, err := a.Allocate(ctx, "next", allocator.Request{Devices: []string{"2"}}); err != nil {
		t.Fatalf("the freed GPU cannot be allocated: %v", err)
	}
	if _, err := a.Retain(ctx, "job", []string{"1", "3"}); err != nil {
		t.Fatalf("keeping everything held: %v", err)
	}
}
