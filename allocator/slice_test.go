package allocator_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

func slice(n int) *allocator.Share {
	return &allocator.Share{Mode: allocator.ShareSlice, Slices: n}
}

func TestSliceValidate(t *testing.T) {
	tests := map[string]struct {
		s  allocator.Share
		ok bool
	}{
		"two":                  {allocator.Share{Mode: allocator.ShareSlice, Slices: 2}, true},
		"the most":             {allocator.Share{Mode: allocator.ShareSlice, Slices: allocator.MaxSlices}, true},
		"memory as allocated":  {allocator.Share{Mode: allocator.ShareSlice, Slices: 4, MemoryBytes: 4 << 30}, true},
		"no count":             {allocator.Share{Mode: allocator.ShareSlice}, false},
		"one":                  {allocator.Share{Mode: allocator.ShareSlice, Slices: 1}, false},
		"negative":             {allocator.Share{Mode: allocator.ShareSlice, Slices: -4}, false},
		"past the most":        {allocator.Share{Mode: allocator.ShareSlice, Slices: allocator.MaxSlices + 1}, false},
		"compute of its own":   {allocator.Share{Mode: allocator.ShareSlice, Slices: 4, ComputePercent: 25}, false},
		"memory share counted": {allocator.Share{MemoryBytes: 1 << 30, Slices: 4}, false},
		"time slice counted":   {allocator.Share{Mode: allocator.ShareTime, Slices: 4}, false},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			err := tt.s.Validate()
			if tt.ok != (err == nil) || err != nil && !errors.Is(err, allocator.ErrInvalidRequest) {
				t.Fatalf("Validate(%+v) = %v, want ok %v", tt.s, err, tt.ok)
			}
		})
	}
}

// TestSliceRequestRefused: a slice request that is malformed is refused
// with ErrInvalidRequest and takes nothing.
func TestSliceRequestRefused(t *testing.T) {
	a := newAlloc(t, "dgx1-volta", allocator.WithShared("0", "1"))
	for name, s := range map[string]*allocator.Share{
		"one slice":    slice(1),
		"49 slices":    slice(49),
		"memory asked": {Mode: allocator.ShareSlice, Slices: 4, MemoryBytes: 1 << 30},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := a.Allocate(context.Background(), "x", allocator.Request{Share: s})
			if !errors.Is(err, allocator.ErrInvalidRequest) {
				t.Fatalf("err = %v, want ErrInvalidRequest", err)
			}
			if owners := a.Allocations(); len(owners) != 0 {
				t.Fatalf("owners %v after a refused request", owners)
			}
		})
	}
}

// TestSlicePlacement: slices of one count pack onto one GPU, at most N of
// them; a slice of another count, a memory share and a time slice go to
// other GPUs; a full node says why for each GPU.
func TestSlicePlacement(t *testing.T) {
	ctx := context.Background()
	a := newAlloc(t, "dgx1-volta", allocator.WithShared("0", "1", "2", "3", "4"))
	mem := a.Devices()[0].MemoryBytes
	gpuOf := func(al allocator.Allocation) int { return al.Devices[0].Index }
	first := allocOK(t, a, "s4-0", allocator.Request{Share: slice(4)})
	if s := first.Share; s == nil || s.Mode != allocator.ShareSlice || s.Slices != 4 || s.MemoryBytes != mem/4 || first.Shared || first.MemoryBytes != 0 {
		t.Fatalf("first slice: %+v (share %+v), want 1 of 4 slices of %d bytes", first, first.Share, mem/4)
	}
	for i := 1; i < 4; i++ {
		if al := allocOK(t, a, fmt.Sprintf("s4-%d", i), allocator.Request{Share: slice(4)}); gpuOf(al) != gpuOf(first) {
			t.Fatalf("slice %d on gpu %d, want packed on %d", i, gpuOf(al), gpuOf(first))
		}
	}
	fifth := allocOK(t, a, "s4-4", allocator.Request{Share: slice(4)})
	if gpuOf(fifth) == gpuOf(first) {
		t.Fatalf("a fifth slice of 4 on gpu %d, which holds 4", gpuOf(first))
	}
	two := allocOK(t, a, "s2-0", allocator.Request{Share: slice(2)})
	mshare := allocOK(t, a, "m", allocator.Request{Share: &allocator.Share{MemoryBytes: 1 << 30}})
	ts := allocOK(t, a, "t", allocator.Request{Share: &allocator.Share{Mode: allocator.ShareTime}})
	seen := map[int]string{}
	for _, al := range []allocator.Allocation{first, fifth, two, mshare, ts} {
		if o, ok := seen[gpuOf(al)]; ok {
			t.Fatalf("%s and %s on one gpu %d: kinds or counts mixed", o, al.Owner, gpuOf(al))
		}
		seen[gpuOf(al)] = al.Owner
	}
	// Every shareable GPU is taken by another kind or count: a slice of 3
	// finds no room, and the error names each GPU's reason.
	_, err := a.Allocate(ctx, "s3", allocator.Request{Share: slice(3)})
	var se *allocator.ShareError
	if !errors.As(err, &se) || !errors.Is(err, node.ErrInsufficient) {
		t.Fatalf("err = %v, want a *ShareError", err)
	}
	if !strings.Contains(err.Error(), "split in 4 slices, not 3") {
		t.Fatalf("err = %v, want the reason of a GPU split in 4", err)
	}
	// The second slice of 4 packs onto the GPU with the fifth, not a new one.
	if err := a.Release(ctx, "s2-0"); err != nil {
		t.Fatal(err)
	}
	if al := allocOK(t, a, "s4-5", allocator.Request{Share: slice(4)}); gpuOf(al) != gpuOf(fifth) {
		t.Fatalf("slice on gpu %d, want packed beside the fifth on %d", gpuOf(al), gpuOf(fifth))
	}
	if err := allocator.CheckInvariants(a); err != nil {
		t.Fatal(err)
	}
}

// TestSliceClaim: Claim with AsShare re-holds a slice, idempotently, and
// refuses one of another count on a GPU already split.
func TestSliceClaim(t *testing.T) {
	ctx := context.Background()
	a := newAlloc(t, "dgx1-volta", allocator.WithShared("0"))
	dev := a.Devices()[0].Ref()
	mem := a.Devices()[0].MemoryBytes
	al, err := a.Claim(ctx, "c1", []node.DeviceRef{dev}, allocator.AsShare(*slice(4)))
	if err != nil || al.Share == nil || al.Share.Slices != 4 || al.Share.MemoryBytes != mem/4 {
		t.Fatalf("claim: %+v, %v", al, err)
	}
	// Again, with the share as the allocation had it (its memory set).
	if _, err := a.Claim(ctx, "c1", []node.DeviceRef{dev}, allocator.AsShare(*al.Share)); err != nil {
		t.Fatalf("claim again: %v", err)
	}
	if _, err := a.Claim(ctx, "c1", []node.DeviceRef{dev}, allocator.AsShare(*slice(2))); !errors.Is(err, allocator.ErrClaimMismatch) {
		t.Fatalf("claim of c1 as 1 of 2: %v, want ErrClaimMismatch", err)
	}
	if _, err := a.Claim(ctx, "c2", []node.DeviceRef{dev}, allocator.AsShare(*slice(2))); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("claim of 1 of 2 beside 1 of 4: %v, want ErrDeviceUnavailable", err)
	}
	wrong := allocator.Share{Mode: allocator.ShareSlice, Slices: 4, MemoryBytes: mem / 3}
	if _, err := a.Claim(ctx, "c2", []node.DeviceRef{dev}, allocator.AsShare(wrong)); !errors.Is(err, allocator.ErrInvalidRequest) {
		t.Fatalf("claim of a slice of the wrong memory: %v, want ErrInvalidRequest", err)
	}
	for i := 2; i <= 4; i++ {
		if _, err := a.Claim(ctx, fmt.Sprintf("c%d", i), []node.DeviceRef{dev}, allocator.AsShare(*slice(4))); err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
	}
	if _, err := a.Claim(ctx, "c5", []node.DeviceRef{dev}, allocator.AsShare(*slice(4))); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("a fifth slice of 4: %v, want ErrDeviceUnavailable", err)
	}
	if err := allocator.CheckInvariants(a); err != nil {
		t.Fatal(err)
	}
}

// TestSliceStateSurvives: slices are in the state file, and a new
// allocator on it holds them as they were.
func TestSliceStateSurvives(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	inv := simInv(t, "dgx1-volta")
	a, err := allocator.New(inv, allocator.WithStateDir(dir), allocator.WithShared("0", "1"))
	if err != nil {
		t.Fatal(err)
	}
	x := allocOK(t, a, "x", allocator.Request{Share: slice(4)})
	allocOK(t, a, "y", allocator.Request{Share: slice(4)})
	a.Close()
	b, err := allocator.New(inv, allocator.WithStateDir(dir), allocator.WithShared("0", "1"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got, err := b.Allocation("x")
	if err != nil || got.Share == nil || *got.Share != *x.Share || got.Devices[0].UUID != x.Devices[0].UUID {
		t.Fatalf("after a restart: %+v (%v), want %+v", got, err, x)
	}
	// The reloaded GPU is split in 4: a slice of 2 goes elsewhere.
	if al, err := b.Allocate(ctx, "z", allocator.Request{Share: slice(2)}); err != nil || al.Devices[0].UUID == x.Devices[0].UUID {
		t.Fatalf("slice of 2: %+v, %v", al, err)
	}
	hs, err := allocator.ReadHoldings(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if h.Owner == "x" && (h.Share == nil || h.Share.Slices != 4 || h.Share.Mode != allocator.ShareSlice) {
			t.Fatalf("ReadHoldings: %+v", h)
		}
	}
}

// TestSliceStateCorrupt: a state file that mixes slice counts on one GPU,
// or holds more than N slices of N, is refused as corrupt.
func TestSliceStateCorrupt(t *testing.T) {
	inv := simInv(t, "dgx1-volta")
	dev := inv.Devices[0]
	owner := func(name string, n int) string {
		return fmt.Sprintf(`{"owner":%q,"shared":{"index":%d,"uuid":%q},"memoryBytes":%d,"shareMode":"slice","slices":%d}`, name, dev.Index, dev.UUID, dev.MemoryBytes/uint64(n), n)
	}
	tests := map[string][]string{
		"two counts":  {owner("a", 4), owner("b", 2)},
		"three of 2":  {owner("a", 2), owner("b", 2), owner("c", 2)},
		"count 1":     {owner("a", 1)},
		"count of 99": {owner("a", 99)},
	}
	for name, owners := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeSliceState(t, dir, `{"owners":[`+strings.Join(owners, ",")+`]}`)
			_, err := allocator.New(inv, allocator.WithStateDir(dir), allocator.WithShared("0"))
			if !errors.Is(err, allocator.ErrCorruptState) {
				t.Fatalf("err = %v, want ErrCorruptState", err)
			}
		})
	}
	t.Run("two of 2", func(t *testing.T) {
		dir := t.TempDir()
		writeSliceState(t, dir, `{"owners":[`+owner("a", 2)+","+owner("b", 2)+`]}`)
		a, err := allocator.New(inv, allocator.WithStateDir(dir), allocator.WithShared("0"))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		if err := allocator.CheckInvariants(a); err != nil {
			t.Fatal(err)
		}
	})
}

// writeSliceState writes state, the allocator's state as JSON, in its file
// format (envelope, version 1, checksum) in dir.
func writeSliceState(t *testing.T, dir, state string) {
	t.Helper()
	sum := sha256.Sum256([]byte(state))
	b, err := json.Marshal(map[string]any{"format": "gpuiso.allocator.state", "version": 1, "checksum": "sha256:" + hex.EncodeToString(sum[:]), "state": json.RawMessage(state)})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, allocator.StateFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestSliceRandomNeverMixes runs random allocations of every kind of
// share (slices of 2, 3 and 4, memory shares, time slices), claims and
// releases, and checks after every step, from the outside (Shares) as well
// as the invariants, that no GPU holds two kinds of share or two slice
// counts, and that no GPU split in N holds more than N slices.
func TestSliceRandomNeverMixes(t *testing.T) {
	ctx := context.Background()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	a := newAlloc(t, "dgx1-volta", allocator.WithShared("0", "1", "2", "3"), allocator.WithTimeSlices(3))
	devs := a.Devices()
	var held []string
	for step := range 4000 {
		owner := fmt.Sprintf("o%d", step)
		var s *allocator.Share
		switch k := rng.IntN(6); k {
		case 0, 1, 2:
			s = slice(2 + k)
		case 3:
			s = &allocator.Share{MemoryBytes: 1 + rng.Uint64N(devs[0].MemoryBytes/2)}
		case 4:
			s = &allocator.Share{Mode: allocator.ShareTime}
		}
		switch {
		case s != nil && rng.IntN(4) == 0:
			// A claim on a GPU of the caller's choosing.
			d := devs[rng.IntN(4)].Ref()
			if _, err := a.Claim(ctx, owner, []node.DeviceRef{d}, allocator.AsShare(*s)); err == nil {
				held = append(held, owner)
			} else if !errors.Is(err, allocator.ErrDeviceUnavailable) {
				t.Fatalf("step %d: claim %s: %v", step, s, err)
			}
		case s != nil:
			if _, err := a.Allocate(ctx, owner, allocator.Request{Share: s}); err == nil {
				held = append(held, owner)
			} else if !errors.Is(err, node.ErrInsufficient) {
				t.Fatalf("step %d: allocate %s: %v", step, s, err)
			}
		case len(held) > 0:
			i := rng.IntN(len(held))
			if err := a.Release(ctx, held[i]); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			held = append(held[:i], held[i+1:]...)
		}
		if err := allocator.CheckInvariants(a); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for _, d := range devs[:4] {
			shares, err := a.Shares(d.UUID)
			if err != nil {
				t.Fatal(err)
			}
			for _, al := range shares {
				f := shares[0].Share
				if al.Share.Mode != f.Mode || al.Share.Slices != f.Slices {
					t.Fatalf("step %d: gpu %d holds %s beside %s", step, d.Index, al.Share, f)
				}
				if f.Mode == allocator.ShareSlice && len(shares) > f.Slices {
					t.Fatalf("step %d: gpu %d holds %d slices of %d", step, d.Index, len(shares), f.Slices)
				}
			}
		}
	}
}
