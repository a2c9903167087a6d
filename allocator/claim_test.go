package allocator_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// refs are the references of the devices at positions ps of a's node.
func refs(a *allocator.Allocator, ps ...int) []node.DeviceRef {
	devs := a.Devices()
	out := make([]node.DeviceRef, len(ps))
	for i, p := range ps {
		out[i] = devs[p].Ref()
	}
	return out
}

func uuidSet(refs []node.DeviceRef) []string {
	out := make([]string, len(refs))
	for i, r := range refs {
		out[i] = r.UUID
	}
	slices.Sort(out)
	return out
}

// TestClaim: a claim is idempotent, compares sets, and on every refusal
// changes nothing.
func TestClaim(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		// before runs on the fresh allocator.
		before func(*testing.T, *allocator.Allocator)
		owner  string
		claim  func(*allocator.Allocator) []node.DeviceRef
		want   error // nil: the owner holds exactly the claim afterwards
	}{
		{name: "free devices are taken", owner: "c",
			claim: func(a *allocator.Allocator) []node.DeviceRef { return refs(a, 1, 3) }},
		{name: "held exactly is a no-op", owner: "c",
			before: func(t *testing.T, a *allocator.Allocator) {
				allocOK(t, a, "c", allocator.Request{Devices: []string{"1", "3"}})
			},
			claim: func(a *allocator.Allocator) []node.DeviceRef { return refs(a, 1, 3) }},
		{name: "held in another order is a no-op", owner: "c",
			before: func(t *testing.T, a *allocator.Allocator) {
				allocOK(t, a, "c", allocator.Request{Devices: []string{"1", "3"}})
			},
			claim: func(a *allocator.Allocator) []node.DeviceRef { return refs(a, 3, 1) }},
		{name: "by index when a ref has no uuid", owner: "c",
			claim: func(a *allocator.Allocator) []node.DeviceRef {
				r := refs(a, 2)
				r[0].UUID = ""
				return r
			}},
		{name: "a shared allocation is held by its one gpu", owner: "c",
			before: func(t *testing.T, a *allocator.Allocator) {
				allocOK(t, a, "c", allocator.Request{Share: &allocator.Share{MemoryBytes: 1 << 30}})
			},
			claim: func(a *allocator.Allocator) []node.DeviceRef { return refs(a, 7) }},
		{name: "nothing for an owner holding nothing", owner: "c",
			claim: func(a *allocator.Allocator) []node.DeviceRef { return nil }},
		{name: "held by another owner", owner: "c", want: allocator.ErrDeviceUnavailable,
			before: func(t *testing.T, a *allocator.Allocator) {
				allocOK(t, a, "other", allocator.Request{Devices: []string{"3"}})
			},
			claim: func(a *allocator.Allocator) []node.DeviceRef { return refs(a, 1, 3) }},
		{name: "unhealthy", owner: "c", want: allocator.ErrDeviceUnavailable,
			before: func(t *testing.T, a *allocator.Allocator) {
				if _, err := a.MarkUnhealthy(ctx, "3", "xid 79"); err != nil {
					t.Fatal(err)
				}
			},
			claim: func(a *allocator.Allocator) []node.DeviceRef { return refs(a, 1, 3) }},
		{name: "shared by others", owner: "c", want: allocator.ErrDeviceUnavailable,
			before: func(t *testing.T, a *allocator.Allocator) {
				allocOK(t, a, "s", allocator.Request{Share: &allocator.Share{MemoryBytes: 1 << 30}})
			},
			claim: func(a *allocator.Allocator) []node.DeviceRef { return refs(a, 7) }},
		{name: "owner holds a smaller set", owner: "c", want: allocator.ErrClaimMismatch,
			before: func(t *testing.T, a *allocator.Allocator) {
				allocOK(t, a, "c", allocator.Request{Devices: []string{"1"}})
			},
			claim: func(a *allocator.Allocator) []node.DeviceRef { return refs(a, 1, 3) }},
		{name: "owner holds a larger set", owner: "c", want: allocator.ErrClaimMismatch,
			before: func(t *testing.T, a *allocator.Allocator) {
				allocOK(t, a, "c", allocator.Request{Devices: []string{"1", "3"}})
			},
			claim: func(a *allocator.Allocator) []node.DeviceRef { return refs(a, 1) }},
		{name: "owner holds gpus, claims none", owner: "c", want: allocator.ErrClaimMismatch,
			before: func(t *testing.T, a *allocator.Allocator) {
				allocOK(t, a, "c", allocator.Request{Devices: []string{"1"}})
			},
			claim: func(a *allocator.Allocator) []node.DeviceRef { return nil }},
		{name: "unknown device", owner: "c", want: allocator.ErrUnknownDevice,
			claim: func(a *allocator.Allocator) []node.DeviceRef {
				return append(refs(a, 1), node.DeviceRef{UUID: "GPU-00000000-0000-0000-0000-000000000000"})
			}},
		{name: "device named twice", owner: "c", want: allocator.ErrDuplicateDevice,
			claim: func(a *allocator.Allocator) []node.DeviceRef { return refs(a, 1, 1) }},
		{name: "invalid owner", owner: "../c", want: node.ErrInvalid,
			claim: func(a *allocator.Allocator) []node.DeviceRef { return refs(a, 1) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := newAlloc(t, "dgx1-volta", allocator.WithShared("7"), allocator.WithStateDir(t.TempDir()))
			defer a.Close()
			if tc.before != nil {
				tc.before(t, a)
			}
			before := a.Allocations()
			claim := tc.claim(a)
			al, err := a.Claim(ctx, tc.owner, claim)
			if err := allocator.CheckInvariants(a); err != nil {
				t.Fatal(err)
			}
			if tc.want != nil {
				if !errors.Is(err, tc.want) {
					t.Fatalf("claim: %v, want %v", err, tc.want)
				}
				if after := a.Allocations(); !reflect.DeepEqual(after, before) {
					t.Fatalf("a refused claim changed the allocations:\n%v\nto\n%v", before, after)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got, want := uuidSet(al.Devices), uuidSet(refs(a, indexes(a, claim)...)); !slices.Equal(got, want) {
				t.Fatalf("claim returned %v, want %v", got, want)
			}
			if len(claim) == 0 {
				if _, err := a.Allocation(tc.owner); !errors.Is(err, allocator.ErrUnknownOwner) {
					t.Fatalf("an empty claim holds something: %v", err)
				}
				return
			}
			held, err := a.Allocation(tc.owner)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(uuidSet(held.Devices), uuidSet(al.Devices)) {
				t.Fatalf("holds %v, claim returned %v", held.Devices, al.Devices)
			}
			// Again: the same answer, nothing changed.
			again, err := a.Claim(ctx, tc.owner, claim)
			if err != nil || !reflect.DeepEqual(again, held) {
				t.Fatalf("second claim: %v, %v; want %v", again, err, held)
			}
		})
	}
}

// indexes are the positions of claim's devices (by UUID, else index).
func indexes(a *allocator.Allocator, claim []node.DeviceRef) []int {
	var out []int
	for _, r := range claim {
		for p, d := range a.Devices() {
			if (r.UUID != "" && d.UUID == r.UUID) || (r.UUID == "" && d.Index == r.Index) {
				out = append(out, p)
			}
		}
	}
	return out
}

// TestClaimMIG: MIG devices are claimed by their "MIG-" UUIDs, as sets; a
// GPU whose MIG devices are handed out cannot be claimed whole.
func TestClaimMIG(t *testing.T) {
	ctx := context.Background()
	a := newAlloc(t, "hgx-h100-mig")
	gpu1 := a.Devices()[1]
	m := []node.DeviceRef{gpu1.MIGRef(gpu1.MIGDevices[0]), gpu1.MIGRef(gpu1.MIGDevices[2])}
	al, err := a.Claim(ctx, "m", m)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(uuidSet(al.Devices), uuidSet(m)) {
		t.Fatalf("claimed %v, want %v", uuidSet(al.Devices), uuidSet(m))
	}
	if _, err := a.Claim(ctx, "m", []node.DeviceRef{m[1], m[0]}); err != nil {
		t.Fatalf("the same MIG devices in another order: %v", err)
	}
	if _, err := a.Claim(ctx, "m", m[:1]); !errors.Is(err, allocator.ErrClaimMismatch) {
		t.Fatalf("a subset of the held MIG devices: %v", err)
	}
	if _, err := a.Claim(ctx, "other", m[1:]); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("another owner's MIG device: %v", err)
	}
	if _, err := a.Claim(ctx, "whole", []node.DeviceRef{gpu1.Ref()}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("a GPU with MIG enabled, whole: %v", err)
	}
	mixed := []node.DeviceRef{gpu1.MIGRef(gpu1.MIGDevices[1]), a.Devices()[len(a.Devices())-1].Ref()}
	if _, err := a.Claim(ctx, "mixed", mixed); !errors.Is(err, allocator.ErrInvalidRequest) {
		t.Fatalf("whole GPUs and MIG devices together: %v", err)
	}
	if err := allocator.CheckInvariants(a); err != nil {
		t.Fatal(err)
	}
	if got := len(a.Allocations()); got != 1 {
		t.Fatalf("%d allocations, want only m's", got)
	}
}

// claimWorkerEnv names, in a child process, a state directory and the
// GPU indexes to claim there for owner "child" (dir:1,3).
const claimWorkerEnv = "GPUISO_ALLOCATOR_CLAIM_WORKER"

func claimWorker(arg string) int {
	dir, list, _ := strings.Cut(arg, ":")
	inv, err := simInventory("dgx1-volta")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	a, err := allocator.New(inv, allocator.WithStateDir(dir))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	defer a.Close()
	var claim []node.DeviceRef
	for _, i := range strings.Split(list, ",") {
		var n int
		fmt.Sscan(i, &n)
		claim = append(claim, inv.Devices[n].Ref())
	}
	if _, err := a.Claim(context.Background(), "child", claim); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 4
	}
	return 0
}

// TestClaimAcrossProcesses: a claim made in one process is on disk when it
// returns; another process's allocator on the same directory sees it,
// repeats it as a no-op and refuses the devices to anyone else, and a
// claim that differs leaves the state file as it was.
func TestClaimAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	run := func(list string) error {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), claimWorkerEnv+"="+dir+":"+list)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	a := newAlloc(t, "dgx1-volta", allocator.WithStateDir(dir))
	defer a.Close()
	if err := run("3,1"); err != nil {
		t.Fatal(err)
	}
	held, err := a.Allocation("child")
	if err != nil {
		t.Fatalf("the child's claim is not in the shared state: %v", err)
	}
	if got := allocIndexes(held); !slices.Equal(got, []int{1, 3}) {
		t.Fatalf("child holds %v, want [1 3]", got)
	}
	if _, err := a.Claim(ctx, "child", refs(a, 1, 3)); err != nil {
		t.Fatalf("the same claim from another process: %v", err)
	}
	if _, err := a.Claim(ctx, "other", refs(a, 3)); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("another owner claimed the child's GPU: %v", err)
	}
	state, err := os.ReadFile(dir + "/" + allocator.StateFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := run("1"); err == nil || !strings.Contains(err.Error(), "exit status 4") {
		t.Fatalf("a differing claim in another process: %v", err)
	}
	if again, _ := os.ReadFile(dir + "/" + allocator.StateFile); string(again) != string(state) {
		t.Fatal("a refused claim rewrote the state file")
	}
	if err := run("1,3"); err != nil {
		t.Fatalf("the same claim again in a new process: %v", err)
	}
}

// TestSetHolder: the holder changes in one step; the devices stay held.
func TestSetHolder(t *testing.T) {
	ctx := context.Background()
	a := newAlloc(t, "dgx1-volta", allocator.WithStateDir(t.TempDir()))
	defer a.Close()
	allocOK(t, a, "c", allocator.Request{Devices: []string{"2"}, Holder: &allocator.Holder{Pid: 1, Start: 1}})
	cases := []struct {
		name   string
		owner  string
		holder *allocator.Holder
		want   error
	}{
		{name: "new holder", owner: "c", holder: &allocator.Holder{Pid: os.Getpid(), Start: 42}},
		{name: "no holder", owner: "c"},
		{name: "unknown owner", owner: "x", holder: &allocator.Holder{Pid: 1, Start: 1}, want: allocator.ErrUnknownOwner},
		{name: "invalid holder", owner: "c", holder: &allocator.Holder{Pid: 0, Start: 1}, want: allocator.ErrInvalidRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := a.Allocation("c")
			err := a.SetHolder(ctx, tc.owner, tc.holder)
			after, _ := a.Allocation("c")
			if tc.want != nil {
				if !errors.Is(err, tc.want) || !reflect.DeepEqual(before, after) {
					t.Fatalf("set holder: %v, allocation %v -> %v", err, before, after)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(allocIndexes(after), []int{2}) || !reflect.DeepEqual(after.Holder, tc.holder) {
				t.Fatalf("after set holder: %+v", after)
			}
		})
	}
}

// TestClaimHeldBy: a claim names the holder of what it claims: of a new
// allocation, and of one the owner held already with another holder or
// none, in the same change (kept after a reload of the state); a claim that
// is refused, or a holder that is no process, changes nothing.
func TestClaimHeldBy(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAlloc(t, "dgx1-volta", allocator.WithStateDir(dir))
	defer a.Close()
	h1 := allocator.Holder{Pid: os.Getpid(), Start: 42}
	h2 := allocator.Holder{Pid: os.Getpid(), Start: 43}
	if al, err := a.Claim(ctx, "new", refs(a, 0, 1), allocator.HeldBy(h1)); err != nil || al.Holder == nil || *al.Holder != h1 {
		t.Fatalf("new claim: %+v, %v", al, err)
	}
	allocOK(t, a, "bare", allocator.Request{Devices: []string{"2"}})
	if al, err := a.Claim(ctx, "bare", refs(a, 2), allocator.HeldBy(h2)); err != nil || al.Holder == nil || *al.Holder != h2 {
		t.Fatalf("claim of an allocation without holder: %+v, %v", al, err)
	}
	if al, err := a.Claim(ctx, "new", refs(a, 1, 0), allocator.HeldBy(h2)); err != nil || al.Holder == nil || *al.Holder != h2 {
		t.Fatalf("claim of an allocation of another holder: %+v, %v", al, err)
	}
	if al, err := a.Claim(ctx, "new", refs(a, 0, 1)); err != nil || al.Holder == nil || *al.Holder != h2 {
		t.Fatalf("claim without HeldBy changed the holder: %+v, %v", al, err)
	}
	gpu := a.Devices()[3].Ref()
	if al, err := a.ClaimShare(ctx, "share", gpu, allocator.Share{Mode: allocator.ShareTime}, allocator.HeldBy(h1)); err != nil || al.Holder == nil || *al.Holder != h1 {
		t.Fatalf("share claim: %+v, %v", al, err)
	}
	before := a.Allocations()
	for name, claim := range map[string]func() error{
		"mismatch": func() error { _, err := a.Claim(ctx, "new", refs(a, 0), allocator.HeldBy(h1)); return err },
		"invalid holder": func() error {
			_, err := a.Claim(ctx, "new", refs(a, 0, 1), allocator.HeldBy(allocator.Holder{}))
			return err
		},
		"nil option": func() error { _, err := a.Claim(ctx, "other", refs(a, 4), nil); return err },
		"share mismatch": func() error {
			_, err := a.ClaimShare(ctx, "share", a.Devices()[4].Ref(), allocator.Share{Mode: allocator.ShareTime}, allocator.HeldBy(h2))
			return err
		},
	} {
		if err := claim(); err == nil {
			t.Errorf("%s: claimed", name)
		}
		if after := a.Allocations(); !reflect.DeepEqual(before, after) {
			t.Fatalf("%s changed %+v to %+v", name, before, after)
		}
	}
	b := newAlloc(t, "dgx1-volta", allocator.WithStateDir(dir))
	defer b.Close()
	for owner, want := range map[string]allocator.Holder{"new": h2, "bare": h2, "share": h1} {
		if al, err := b.Allocation(owner); err != nil || al.Holder == nil || *al.Holder != want {
			t.Errorf("%s after a reload: %+v, %v; want held by %+v", owner, al, err, want)
		}
	}
}
