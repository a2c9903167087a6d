package allocator_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

const gib = 1 << 30

// allGPUs names every GPU of an inventory by index, for WithShared.
func allGPUs(inv *node.Inventory) []string {
	var out []string
	for _, d := range inv.Devices {
		out = append(out, strconv.Itoa(d.Index))
	}
	return out
}

func memShare(bytes uint64) *allocator.Share {
	return &allocator.Share{Mode: allocator.ShareMemory, MemoryBytes: bytes}
}

func timeSlice() *allocator.Share { return &allocator.Share{Mode: allocator.ShareTime} }

// TestSharesPackAndKeepWholeGPUs: on a DGX-1 whose eight 16 GiB GPUs are
// all shareable, eight 4 GiB shares fill two GPUs, not eight, and six GPUs
// stay free for an exclusive request; time slices pack the same way on GPUs
// of their own.
func TestSharesPackAndKeepWholeGPUs(t *testing.T) {
	inv := simInv(t, "dgx1-volta")
	a := newAlloc(t, "dgx1-volta", allocator.WithShared(allGPUs(inv)...), allocator.WithTimeSlices(3))
	gpus := map[int]int{}
	for i := range 8 {
		al := allocOK(t, a, "m"+string(rune('a'+i)), allocator.Request{Share: memShare(4 * gib)})
		if !al.Shared || al.Share == nil || al.Share.Mode != allocator.ShareMemory || al.MemoryBytes != 4*gib || len(al.Devices) != 1 {
			t.Fatalf("share %d = %+v", i, al)
		}
		gpus[al.Devices[0].Index]++
	}
	if len(gpus) != 2 {
		t.Fatalf("8 shares of 4 GiB on %d GPUs (%v), want 2", len(gpus), gpus)
	}
	slices := map[int]int{}
	for i := range 4 {
		al := allocOK(t, a, "t"+string(rune('a'+i)), allocator.Request{Share: timeSlice()})
		if al.Shared || al.Share == nil || al.Share.Mode != allocator.ShareTime || al.MemoryBytes != 0 {
			t.Fatalf("time slice %d = %+v", i, al)
		}
		if env := al.Share.ClientEnv(); env != nil {
			t.Fatalf("time slice with an MPS limit: %v", env)
		}
		if gpus[al.Devices[0].Index] > 0 {
			t.Fatalf("time slice on GPU %d, which holds memory shares", al.Devices[0].Index)
		}
		slices[al.Devices[0].Index]++
	}
	if len(slices) != 2 {
		t.Fatalf("4 time slices (3 a GPU) on %v", slices)
	}
	for _, n := range slices {
		if n != 3 && n != 1 {
			t.Fatalf("time slices %v: want 3 on one GPU, 1 on another", slices)
		}
	}
	// Four GPUs left whole.
	whole := allocOK(t, a, "whole", allocator.Request{Count: 4})
	for _, d := range whole.Devices {
		if gpus[d.Index] > 0 || slices[d.Index] > 0 {
			t.Fatalf("exclusive GPU %d is shared", d.Index)
		}
	}
	if err := allocator.CheckInvariants(a); err != nil {
		t.Fatal(err)
	}
}

// TestShareDoesNotFit: a share no GPU has room for is a *ShareError naming
// each GPU's free memory or why it cannot take it, matching ErrInsufficient.
func TestShareDoesNotFit(t *testing.T) {
	ctx := context.Background()
	a := newAlloc(t, "rtx8000x4", allocator.WithShared("0", "1", "2"), allocator.WithTimeSlices(1))
	mem := a.Devices()[0].MemoryBytes
	allocOK(t, a, "big", allocator.Request{Share: memShare(mem - gib)})
	allocOK(t, a, "slice", allocator.Request{Share: timeSlice()})
	allocOK(t, a, "excl", allocator.Request{Devices: []string{"2"}})
	_, err := a.Allocate(ctx, "x", allocator.Request{Share: memShare(2 * gib)})
	var se *allocator.ShareError
	if !errors.As(err, &se) || !errors.Is(err, allocator.ErrInsufficient) || !errors.Is(err, node.ErrInsufficient) {
		t.Fatalf("Allocate = %v, want a *ShareError", err)
	}
	if len(se.GPUs) != 4 || se.Share.MemoryBytes != 2*gib {
		t.Fatalf("ShareError = %+v", se)
	}
	want := []struct {
		free   uint64
		reason string
	}{{gib, "1 GiB free"}, {0, "held by time shares"}, {0, "owned by excl"}, {0, "not shareable"}}
	for i, w := range want {
		if g := se.GPUs[i]; g.FreeBytes != w.free || g.Reason != w.reason || g.Index != i {
			t.Errorf("gpu %d: %+v, want %d free, %q", i, g, w.free, w.reason)
		}
	}
	if !strings.Contains(err.Error(), "gpu 0: 1 GiB free") {
		t.Errorf("error %q does not say what gpu 0 has free", err)
	}
	// A second time slice: the one GPU that takes time slices is full.
	_, err = a.Allocate(ctx, "y", allocator.Request{Share: timeSlice()})
	if !errors.As(err, &se) || se.GPUs[1].Reason != "1 of 1 time slices taken" {
		t.Fatalf("second time slice = %v", err)
	}
	// The failures changed nothing.
	if n := len(a.Allocations()); n != 3 {
		t.Fatalf("%d allocations after failed shares", n)
	}
}

// TestShareRequests: malformed shares are ErrInvalidRequest; the compute
// percentage reaches the environment; MemoryBytes is the memory share it
// always was.
func TestShareRequests(t *testing.T) {
	ctx := context.Background()
	a := newAlloc(t, "rtx8000x4", allocator.WithShared("0", "1"))
	for name, r := range map[string]allocator.Request{
		"no memory":             {Share: &allocator.Share{Mode: allocator.ShareMemory}},
		"compute over 100":      {Share: &allocator.Share{MemoryBytes: gib, ComputePercent: 101}},
		"negative compute":      {Share: &allocator.Share{MemoryBytes: gib, ComputePercent: -1}},
		"time slice of memory":  {Share: &allocator.Share{Mode: allocator.ShareTime, MemoryBytes: gib}},
		"time slice of compute": {Share: &allocator.Share{Mode: allocator.ShareTime, ComputePercent: 5}},
		"unknown mode":          {Share: &allocator.Share{Mode: "space", MemoryBytes: gib}},
		"two memories":          {Share: memShare(gib), MemoryBytes: 2 * gib},
		"time and memory":       {Share: timeSlice(), MemoryBytes: gib},
		"two gpus":              {Share: timeSlice(), Count: 2},
	} {
		if _, err := a.Allocate(ctx, "o", r); !errors.Is(err, allocator.ErrInvalidRequest) {
			t.Errorf("%s: %v, want ErrInvalidRequest", name, err)
		}
	}
	al := allocOK(t, a, "c", allocator.Request{Share: &allocator.Share{MemoryBytes: 3 * gib, ComputePercent: 25}})
	if al.Share.Mode != allocator.ShareMemory || !slices.Equal(al.Share.ClientEnv(), []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3072M"}) {
		t.Fatalf("share with compute = %+v", al)
	}
	old := allocOK(t, a, "old", allocator.Request{MemoryBytes: gib, Share: memShare(gib)})
	if !old.Shared || old.Share.MemoryBytes != gib {
		t.Fatalf("MemoryBytes with the same share = %+v", old)
	}
	// Named: a share of GPU 1 lands there.
	one := allocOK(t, a, "one", allocator.Request{Share: timeSlice(), Devices: []string{"1"}})
	if one.Devices[0].Index != 1 {
		t.Fatalf("time slice of gpu 1 on %d", one.Devices[0].Index)
	}
	if _, err := a.Allocate(ctx, "two", allocator.Request{Share: memShare(gib), Devices: []string{"1"}}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("memory share of a time-sliced GPU: %v", err)
	}
	shares, err := a.Shares("0")
	if err != nil || len(shares) != 2 || shares[0].Owner != "c" || shares[1].Owner != "old" {
		t.Fatalf("Shares(0) = %+v, %v", shares, err)
	}
	if s := (allocator.Share{MemoryBytes: 3 * gib, ComputePercent: 25}).String(); s != "3 GiB, 25% compute" {
		t.Fatalf("String = %q", s)
	}
}

// TestShareOfMIGParent: a GPU with MIG enabled is not shared whole: a
// share on a node whose free whole GPUs are all taken says why per GPU.
func TestShareOfMIGParent(t *testing.T) {
	ctx := context.Background()
	inv := simInv(t, "hgx-h100-mig")
	a := newAlloc(t, "hgx-h100-mig", allocator.WithShared("7"))
	allocOK(t, a, "all", allocator.Request{Share: memShare(a.Devices()[7].MemoryBytes)})
	_, err := a.Allocate(ctx, "more", allocator.Request{Share: memShare(gib)})
	var se *allocator.ShareError
	if !errors.As(err, &se) {
		t.Fatalf("share on a full node: %v", err)
	}
	for _, g := range se.GPUs {
		if d := inv.Devices[g.Index]; d.MIGSplit() && !strings.HasPrefix(g.Reason, "MIG enabled") {
			t.Errorf("gpu %d (MIG) reason %q", g.Index, g.Reason)
		}
	}
}

// TestClaimShare: the recovery of a share (Claim with AsShare) is
// idempotent, refuses another holding and a claim of other than one
// device, and takes a GPU not configured shareable as its record says;
// the deprecated ClaimShare claims the same.
func TestClaimShare(t *testing.T) {
	ctx := context.Background()
	a := newAlloc(t, "rtx8000x4", allocator.WithShared("0"))
	gpu := a.Devices()[1].Ref()
	one := []node.DeviceRef{gpu}
	s := allocator.Share{MemoryBytes: 2 * gib, ComputePercent: 50}
	al, err := a.Claim(ctx, "c", one, allocator.AsShare(s))
	if err != nil || al.Share == nil || *al.Share != (allocator.Share{Mode: allocator.ShareMemory, MemoryBytes: 2 * gib, ComputePercent: 50}) || al.Devices[0].UUID != gpu.UUID {
		t.Fatalf("Claim of a share = %+v, %v", al, err)
	}
	if again, err := a.Claim(ctx, "c", one, allocator.AsShare(s)); err != nil || again.Share.MemoryBytes != 2*gib {
		t.Fatalf("Claim of the share again = %+v, %v", again, err)
	}
	if again, err := a.ClaimShare(ctx, "c", gpu, s); err != nil || again.Share.MemoryBytes != 2*gib {
		t.Fatalf("ClaimShare of the share again = %+v, %v", again, err)
	}
	if _, err := a.Claim(ctx, "c", one, allocator.AsShare(allocator.Share{MemoryBytes: gib})); !errors.Is(err, allocator.ErrClaimMismatch) {
		t.Fatalf("Claim of a share of another size: %v", err)
	}
	if _, err := a.ClaimShare(ctx, "c", gpu, allocator.Share{MemoryBytes: gib}); !errors.Is(err, allocator.ErrClaimMismatch) {
		t.Fatalf("ClaimShare of another size: %v", err)
	}
	if _, err := a.Claim(ctx, "t", one, allocator.AsShare(allocator.Share{Mode: allocator.ShareTime})); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("time slice beside a memory share: %v", err)
	}
	allocOK(t, a, "x", allocator.Request{Devices: []string{"2"}})
	if _, err := a.Claim(ctx, "y", []node.DeviceRef{a.Devices()[2].Ref()}, allocator.AsShare(s)); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("share of an owned GPU: %v", err)
	}
	if _, err := a.Claim(ctx, "z", one, allocator.AsShare(allocator.Share{MemoryBytes: a.Devices()[1].MemoryBytes})); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("share over the GPU's memory: %v", err)
	}
	if _, err := a.Claim(ctx, "z", one, allocator.AsShare(allocator.Share{})); !errors.Is(err, allocator.ErrInvalidRequest) {
		t.Fatalf("empty share: %v", err)
	}
	for _, devs := range [][]node.DeviceRef{nil, {gpu, a.Devices()[3].Ref()}} {
		if _, err := a.Claim(ctx, "z", devs, allocator.AsShare(s)); !errors.Is(err, allocator.ErrInvalidRequest) {
			t.Fatalf("share of %d devices: %v", len(devs), err)
		}
	}
	// GPU 3 was not touched by the failures: still whole.
	if _, err := a.Claim(ctx, "w", []node.DeviceRef{a.Devices()[3].Ref()}); err != nil {
		t.Fatal(err)
	}
	if err := allocator.CheckInvariants(a); err != nil {
		t.Fatal(err)
	}
}

// TestShareState: shares of both modes, with their compute, survive in the
// state file; a file that holds a GPU by both modes is corrupt; a file of
// the older format (memory shares without a mode) loads.
func TestShareState(t *testing.T) {
	dir := t.TempDir()
	inv := simInv(t, "rtx8000x4")
	a, err := allocator.New(inv, allocator.WithStateDir(dir), allocator.WithShared("0", "1"))
	if err != nil {
		t.Fatal(err)
	}
	allocOK(t, a, "m", allocator.Request{Share: &allocator.Share{MemoryBytes: gib, ComputePercent: 10}})
	allocOK(t, a, "t", allocator.Request{Share: timeSlice()})
	a.Close()
	b, err := allocator.New(inv, allocator.WithStateDir(dir), allocator.WithShared("0", "1"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	m, _ := b.Allocation("m")
	ts, _ := b.Allocation("t")
	if m.Share == nil || m.Share.ComputePercent != 10 || ts.Share == nil || ts.Share.Mode != allocator.ShareTime || ts.Devices[0].Index == m.Devices[0].Index {
		t.Fatalf("reloaded: %+v, %+v", m, ts)
	}
	b.Close()

	state := filepath.Join(dir, allocator.StateFile)
	raw, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"shareMode":"time"`) || strings.Contains(string(raw), `"shareMode":"memory"`) {
		t.Fatalf("state file: %s", raw)
	}
	for name, st := range map[string]string{
		"older format": `{"owners":[{"owner":"m","shared":{"index":0,"uuid":"` + inv.Devices[0].UUID + `"},"memoryBytes":1073741824}]}`,
		"mixed modes": `{"owners":[{"owner":"m","shared":{"index":0,"uuid":"` + inv.Devices[0].UUID + `"},"memoryBytes":1073741824},` +
			`{"owner":"t","shared":{"index":0,"uuid":"` + inv.Devices[0].UUID + `"},"shareMode":"time"}]}`,
		"time slice of memory":   `{"owners":[{"owner":"t","shared":{"index":0,"uuid":"` + inv.Devices[0].UUID + `"},"shareMode":"time","memoryBytes":5}]}`,
		"share fields, no share": `{"owners":[{"owner":"w","devices":[{"index":0,"uuid":"` + inv.Devices[0].UUID + `"}],"computePercent":5}]}`,
	} {
		d := t.TempDir()
		writeState(t, filepath.Join(d, allocator.StateFile), st)
		c, err := allocator.New(inv, allocator.WithStateDir(d), allocator.WithShared("0"))
		if name == "older format" {
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			al, _ := c.Allocation("m")
			if al.Share == nil || al.Share.Mode != allocator.ShareMemory || !al.Shared {
				t.Fatalf("%s: %+v", name, al)
			}
			c.Close()
			continue
		}
		if !errors.Is(err, allocator.ErrCorruptState) {
			t.Errorf("%s: New = %v, want ErrCorruptState", name, err)
			if c != nil {
				c.Close()
			}
		}
	}
}

// TestShareQuota: a group's shares count their GPU once.
func TestShareQuota(t *testing.T) {
	ctx := context.Background()
	a := newAlloc(t, "rtx8000x4", allocator.WithShared("0", "1", "2", "3"), allocator.WithQuota("g", 1))
	mem := a.Devices()[0].MemoryBytes
	allocOK(t, a, "a", allocator.Request{Group: "g", Share: memShare(mem / 2)})
	allocOK(t, a, "b", allocator.Request{Group: "g", Share: memShare(mem / 2)})
	_, err := a.Allocate(ctx, "c", allocator.Request{Group: "g", Share: memShare(gib)})
	if !errors.Is(err, allocator.ErrQuotaExceeded) {
		t.Fatalf("a share on a second GPU: %v", err)
	}
}

// writeState writes state (the JSON of the saved state) as a state file,
// in its envelope with a correct checksum.
func writeState(t *testing.T, path, state string) {
	t.Helper()
	sum := sha256.Sum256([]byte(state))
	env := `{"format":"gpuiso.allocator.state","version":1,"checksum":"sha256:` + hex.EncodeToString(sum[:]) + `","state":` + state + "}\n"
	if err := os.WriteFile(path, []byte(env), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]uint64{
		"4GiB": 4 << 30, "4 GiB": 4 << 30, "4G": 4 << 30, "4g": 4 << 30, "512M": 512 << 20, "512MiB": 512 << 20,
		"1073741824": 1 << 30, "7B": 7, "2KiB": 2048, "1T": 1 << 40, "3GB": 3e9, "5MB": 5e6, " 8G ": 8 << 30,
	} {
		if got, err := allocator.ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v, want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "0G", "G", "4.5G", "-1G", "4X", "4 Gib bytes", "99999999999999999999", "20000000T"} {
		if _, err := allocator.ParseBytes(in); !errors.Is(err, allocator.ErrInvalidRequest) {
			t.Errorf("ParseBytes(%q): %v, want ErrInvalidRequest", in, err)
		}
	}
}
