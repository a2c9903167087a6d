package allocator_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/attributes"
)

func TestAllocateRequests(t *testing.T) {
	inv := simInv(t, "dgx1-volta")
	tests := []struct {
		name string
		req  allocator.Request
		want []int // GPU indexes, nil when an error is expected
		err  error
	}{
		{"count 4 takes a quad", allocator.Request{Count: 4}, []int{0, 1, 2, 3}, nil},
		{"count 8 takes all", allocator.Request{Count: 8}, []int{0, 1, 2, 3, 4, 5, 6, 7}, nil},
		{"explicit by index", allocator.Request{Devices: []string{"5"}}, []int{5}, nil},
		{"explicit by uuid", allocator.Request{Devices: []string{inv.Devices[6].UUID}}, []int{6}, nil},
		{"explicit by bus id, NVML form", allocator.Request{Devices: []string{"00000000:" + strings.TrimPrefix(inv.Devices[7].BusID, "0000:")}}, []int{7}, nil},
		{"must-include plus count follows NVLink", allocator.Request{Count: 2, Devices: []string{"0"}}, []int{0, 3}, nil},
		{"must-include plus count 4", allocator.Request{Count: 4, Devices: []string{"4"}}, []int{4, 5, 6, 7}, nil},
		{"model in Nomad form", allocator.Request{Count: 1, Model: "nvidia/gpu/Tesla V100-SXM2-16GB"}, nil, nil},
		{"any nvidia gpu", allocator.Request{Count: 2, Model: "nvidia/gpu"}, nil, nil},
		{"model the node lacks", allocator.Request{Count: 1, Model: "nvidia/gpu/A100"}, nil, allocator.ErrInvalidRequest},
		{"attribute the node lacks", allocator.Request{Count: 1, Constraints: []allocator.Constraint{{Attribute: "memroy", Operator: ">=", Value: "1 GiB"}}}, nil, allocator.ErrInvalidRequest},
		{"affinity on an attribute the node lacks", allocator.Request{Count: 1, Affinities: []allocator.Affinity{{Constraint: allocator.Constraint{Attribute: "colour", Operator: "=", Value: "red"}, Weight: 5}}}, nil, allocator.ErrInvalidRequest},
		{"is_not_set of an attribute the node lacks", allocator.Request{Count: 1, Constraints: []allocator.Constraint{{Attribute: "colour", Operator: "is_not_set"}}}, nil, nil},
		{"builtin attribute", allocator.Request{Count: 1, Constraints: []allocator.Constraint{{Attribute: "index", Operator: "=", Value: "3"}}}, nil, nil},
		{"bad model form", allocator.Request{Count: 1, Model: "amd/gpu/x"}, nil, allocator.ErrInvalidRequest},
		{"negative", allocator.Request{Count: -1}, nil, allocator.ErrInvalidRequest},
		{"zero", allocator.Request{}, nil, allocator.ErrInvalidRequest},
		{"more than the node", allocator.Request{Count: 9}, nil, allocator.ErrInvalidRequest},
		{"count below devices", allocator.Request{Count: 1, Devices: []string{"0", "1"}}, nil, allocator.ErrInvalidRequest},
		{"unknown index", allocator.Request{Devices: []string{"8"}}, nil, allocator.ErrUnknownDevice},
		{"unknown uuid", allocator.Request{Devices: []string{"GPU-nope"}}, nil, allocator.ErrUnknownDevice},
		{"duplicate by two names", allocator.Request{Devices: []string{"0", inv.Devices[0].UUID}}, nil, allocator.ErrDuplicateDevice},
		{"constraint holds", allocator.Request{Count: 2, Constraints: []allocator.Constraint{{Attribute: "memory", Operator: ">=", Value: "16 GiB"}}}, nil, nil},
		{"constraint fails", allocator.Request{Count: 1, Constraints: []allocator.Constraint{{Attribute: "memory", Operator: ">", Value: "16 GiB"}}}, nil, node.ErrInsufficient},
		{"bad constraint", allocator.Request{Count: 1, Constraints: []allocator.Constraint{{Attribute: "memory", Operator: "~", Value: "1"}}}, nil, allocator.ErrInvalidRequest},
		{"constraint excludes named device", allocator.Request{Devices: []string{"0"}, Constraints: []allocator.Constraint{{Attribute: "numa_node", Operator: "=", Value: "1"}}}, nil, allocator.ErrDeviceUnavailable},
		{"constraint numa", allocator.Request{Count: 2, Constraints: []allocator.Constraint{{Attribute: "numa_node", Operator: "=", Value: "1"}}}, []int{6, 7}, nil},
		{"affinity pulls", allocator.Request{Count: 1, Affinities: []allocator.Affinity{{Constraint: allocator.Constraint{Attribute: "index", Operator: "=", Value: "6"}, Weight: 50}}}, []int{6}, nil},
		{"bad affinity weight", allocator.Request{Count: 1, Affinities: []allocator.Affinity{{Constraint: allocator.Constraint{Attribute: "index", Operator: "=", Value: "6"}, Weight: 500}}}, nil, allocator.ErrInvalidRequest},
		{"shared on a non-shareable node", allocator.Request{Share: &allocator.Share{MemoryBytes: 1 << 30}}, nil, allocator.ErrShareNotSupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := allocator.New(inv)
			if err != nil {
				t.Fatal(err)
			}
			al, err := a.Allocate(context.Background(), "task-1", tt.req)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("err = %v, want %v", err, tt.err)
				}
				if len(a.Allocations()) != 0 || len(a.Free()) != 8 {
					t.Fatalf("failed request changed the allocator: %v", a.Allocations())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.want != nil && !slices.Equal(allocIndexes(al), tt.want) {
				t.Fatalf("got %v, want %v", allocIndexes(al), tt.want)
			}
			if al.Owner != "task-1" {
				t.Fatalf("allocation %+v", al)
			}
			if err := allocator.CheckInvariants(a); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestInsufficientError(t *testing.T) {
	a := newAlloc(t, "dgx1-volta")
	ctx := context.Background()
	allocOK(t, a, "a", allocator.Request{Count: 6})
	_, err := a.Allocate(ctx, "b", allocator.Request{Count: 3})
	var ie *allocator.InsufficientError
	if !errors.As(err, &ie) || ie.Requested != 3 || ie.Free != 2 || !errors.Is(err, node.ErrInsufficient) {
		t.Fatalf("err = %v (%+v)", err, ie)
	}
	if !strings.HasPrefix(err.Error(), "allocate 3 gpus for b: ") {
		t.Fatalf("message %q", err)
	}
	if _, err := a.Allocate(ctx, "a", allocator.Request{Count: 1}); !errors.Is(err, allocator.ErrOwnerExists) {
		t.Fatalf("second allocation for a: %v", err)
	}
	taken := a.Allocations()[0].Devices[0].Index
	_, err = a.Allocate(ctx, "c", allocator.Request{Devices: []string{fmt.Sprint(taken)}})
	if !errors.Is(err, allocator.ErrDeviceUnavailable) || !strings.Contains(err.Error(), "owned by a") {
		t.Fatalf("owned device: %v", err)
	}
}

func TestOwnerValidation(t *testing.T) {
	a := newAlloc(t, "rtx8000x4")
	for _, owner := range []string{"", "/", "a/b", "..", ".", "a b", "gpu-\u00e9", ".hidden", "-x", "cgroup.procs", "tasks", "devices.allow", "memory.max", "a:b", "tab\there", "nl\n", "del\x7f", "bad\xff", strings.Repeat("a", 129)} {
		_, err := a.Allocate(context.Background(), owner, allocator.Request{Count: 1})
		var oe *node.InvalidOwnerError
		if !errors.As(err, &oe) || !errors.Is(err, node.ErrInvalidOwner) {
			t.Errorf("owner %q: err = %v", owner, err)
		}
	}
	for _, owner := range []string{"task-1", "9f3c1d2e", "a.b_c-d", "x..y", "Task_7", strings.Repeat("a", 128)} {
		if err := node.ValidateOwner(owner); err != nil {
			t.Errorf("owner %q: %v", owner, err)
		}
	}
	if len(a.Allocations()) != 0 {
		t.Fatal("invalid owners got GPUs")
	}
}

func TestReleaseResizeOwners(t *testing.T) {
	ctx := context.Background()
	a := newAlloc(t, "dgx1-volta")
	al := allocOK(t, a, "job", allocator.Request{Count: 2})
	if got := allocIndexes(al); !slices.Equal(got, []int{2, 3}) {
		t.Fatalf("first pair %v", got)
	}
	owners, err := a.Owners("3")
	if err != nil || !slices.Equal(owners, []string{"job"}) {
		t.Fatalf("owners of 3: %v %v", owners, err)
	}
	if owners, _ := a.Owners("4"); len(owners) != 0 {
		t.Fatalf("owners of 4: %v", owners)
	}
	if _, err := a.Owners("GPU-x"); !errors.Is(err, allocator.ErrUnknownDevice) {
		t.Fatal(err)
	}
	// Grow keeps 2 and 3 and adds their best partners.
	al, err = a.Resize(ctx, "job", 4)
	if err != nil {
		t.Fatal(err)
	}
	if got := allocIndexes(al); !slices.Equal(got, []int{0, 1, 2, 3}) {
		t.Fatalf("grown %v", got)
	}
	// Shrink keeps the best-connected pair.
	al, err = a.Resize(ctx, "job", 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := allocIndexes(al); !slices.Equal(got, []int{2, 3}) {
		t.Fatalf("shrunk %v", got)
	}
	if _, err := a.Resize(ctx, "job", 9); !errors.Is(err, allocator.ErrInvalidRequest) {
		t.Fatal(err)
	}
	if _, err := a.Resize(ctx, "nobody", 1); !errors.Is(err, allocator.ErrUnknownOwner) {
		t.Fatal(err)
	}
	allocOK(t, a, "other", allocator.Request{Count: 6})
	if _, err := a.Resize(ctx, "job", 3); !errors.Is(err, node.ErrInsufficient) {
		t.Fatalf("grow on a full node: %v", err)
	}
	if got := allocIndexes(a.Allocations()[0]); !slices.Equal(got, []int{2, 3}) {
		t.Fatalf("failed resize changed the allocation: %v", got)
	}
	if err := a.Release(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, "job"); !errors.Is(err, allocator.ErrUnknownOwner) {
		t.Fatal(err)
	}
	if err := allocator.CheckInvariants(a); err != nil {
		t.Fatal(err)
	}
	// Allocations are copies.
	all := a.Allocations()
	all[0].Devices[0].Model = "changed"
	if a.Allocations()[0].Devices[0].Model == "changed" {
		t.Fatal("Allocations shares memory with the allocator")
	}
}

func TestQuota(t *testing.T) {
	ctx := context.Background()
	a := newAlloc(t, "dgx1-volta", allocator.WithQuota("team-a", 3))
	allocOK(t, a, "a1", allocator.Request{Count: 2, Group: "team-a"})
	_, err := a.Allocate(ctx, "a2", allocator.Request{Count: 2, Group: "team-a"})
	var qe *allocator.QuotaError
	if !errors.As(err, &qe) || qe.Limit != 3 || qe.Used != 2 || qe.Requested != 2 || !errors.Is(err, allocator.ErrQuotaExceeded) {
		t.Fatalf("err = %v", err)
	}
	if len(a.Allocations()) != 1 || len(a.Free()) != 6 {
		t.Fatal("quota error changed the allocator")
	}
	allocOK(t, a, "a2", allocator.Request{Count: 1, Group: "team-a"})
	allocOK(t, a, "b1", allocator.Request{Count: 4, Group: "team-b"})
	if _, err := a.Resize(ctx, "a2", 2); !errors.Is(err, allocator.ErrQuotaExceeded) {
		t.Fatalf("resize over quota: %v", err)
	}
	if _, err := allocator.New(simInv(t, "dgx1-volta"), allocator.WithQuota("", 1)); err == nil {
		t.Fatal("empty quota group accepted")
	}
}

func TestSharedByMemory(t *testing.T) {
	ctx := context.Background()
	a := newAlloc(t, "rtx8000x4", allocator.WithShared("0", "1"))
	mem := a.Devices()[0].MemoryBytes
	if mem == 0 {
		t.Fatal("no memory in the inventory")
	}
	s1 := allocOK(t, a, "s1", allocator.Request{Share: &allocator.Share{MemoryBytes: mem / 2}})
	if !s1.Shared || s1.Devices[0].Index != 0 || !slices.Contains(s1.Share.ClientEnv(), fmt.Sprintf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=%dM", mem/2>>20)) {
		t.Fatalf("s1 = %+v", s1)
	}
	// Best fit: the rest of GPU 0 before an empty GPU 1.
	s2 := allocOK(t, a, "s2", allocator.Request{Share: &allocator.Share{MemoryBytes: mem / 4}})
	if s2.Devices[0].Index != 0 {
		t.Fatalf("s2 on %d", s2.Devices[0].Index)
	}
	s3 := allocOK(t, a, "s3", allocator.Request{Share: &allocator.Share{MemoryBytes: mem / 2}})
	if s3.Devices[0].Index != 1 {
		t.Fatalf("s3 on %d", s3.Devices[0].Index)
	}
	_, err := a.Allocate(ctx, "s4", allocator.Request{Share: &allocator.Share{MemoryBytes: mem/2 + 1}})
	if !errors.Is(err, node.ErrInsufficient) {
		t.Fatalf("over memory: %v", err)
	}
	// Shared GPUs are not handed out whole; whole ones are not shared.
	_, err = a.Allocate(ctx, "x", allocator.Request{Devices: []string{"0"}})
	if !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("exclusive on a shared GPU: %v", err)
	}
	allocOK(t, a, "whole", allocator.Request{Count: 2})
	_, err = a.Allocate(ctx, "s5", allocator.Request{Share: &allocator.Share{MemoryBytes: 1}, Devices: []string{"2"}})
	if !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("share of a non-shareable GPU: %v", err)
	}
	if owners, _ := a.Owners("0"); !slices.Equal(owners, []string{"s1", "s2"}) {
		t.Fatalf("owners of 0: %v", owners)
	}
	if _, err := a.Resize(ctx, "s1", 2); !errors.Is(err, allocator.ErrInvalidRequest) {
		t.Fatalf("resize of a share: %v", err)
	}
	if _, err := a.Allocate(ctx, "s6", allocator.Request{Share: &allocator.Share{MemoryBytes: 1}, Count: 2}); !errors.Is(err, allocator.ErrInvalidRequest) {
		t.Fatalf("shared over 2 GPUs: %v", err)
	}
	for _, o := range []string{"s1", "s2", "s3", "whole"} {
		if err := a.Release(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	allocOK(t, a, "all", allocator.Request{Count: 4})
}

// TestNodeAttributesAndLabels: the deprecated renderings forward to
// package attributes, with the allocator's health.
func TestNodeAttributesAndLabels(t *testing.T) {
	a := newAlloc(t, "dgx1-volta")
	inv := a.Inventory()
	inv.Devices = a.Devices()
	attrs, labels := a.NodeAttributes(), a.Labels()
	if fmt.Sprint(attrs) != fmt.Sprint(attributes.Mesos(inv)) || attrs["gpus"] != "8" {
		t.Errorf("NodeAttributes() = %v, attributes.Mesos = %v", attrs, attributes.Mesos(inv))
	}
	if fmt.Sprint(labels) != fmt.Sprint(attributes.Labels(inv)) || labels["nvidia.com/gpu.count"] != "8" {
		t.Errorf("Labels() = %v, attributes.Labels = %v", labels, attributes.Labels(inv))
	}
	if allocator.LabelsOf(nil) != nil || allocator.FormatMesosAttributes(map[string]string{"a": "1"}) != "a:1" || allocator.LabelValue("(x)") != "x" {
		t.Error("a deprecated forwarder differs from package attributes")
	}
	if _, err := a.MarkUnhealthy(context.Background(), "0", "test"); err != nil {
		t.Fatal(err)
	}
	if got := a.NodeAttributes()["gpus"]; got != "7" {
		t.Errorf("gpus = %s with one GPU unhealthy, want 7", got)
	}
}

func TestNewSettings(t *testing.T) {
	inv := simInv(t, "dgx1-volta")
	for name, s := range map[string]allocator.Option{
		"bad policy":     allocator.WithPolicy("best"),
		"empty dir":      allocator.WithStateDir(""),
		"nil logger":     allocator.WithLogger(nil),
		"unknown shared": allocator.WithShared("GPU-none"),
		"negative quota": allocator.WithQuota("g", -1),
	} {
		if _, err := allocator.New(inv, s); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := allocator.New(nil); !errors.Is(err, allocator.ErrInvalidRequest) {
		t.Errorf("nil inventory: %v", err)
	}
}

func TestCanceledContext(t *testing.T) {
	a := newAlloc(t, "rtx8000x4")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Allocate(ctx, "x", allocator.Request{Count: 1}); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if len(a.Allocations()) != 0 {
		t.Fatal("canceled allocation applied")
	}
}
