package dra_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
)

// specOf returns the path and content of claim uid's CDI spec (nil content
// when there is none).
func (e *env) specOf(t *testing.T, d *dra.Driver, uid string) (string, []byte) {
	t.Helper()
	path, err := cdi.Writer{Dir: e.cdiDir}.AllocationPath(d.CDIKind(), "claim-"+uid)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return path, b
}

// reboot empties the CDI spec directory as a node's boot empties
// /var/run/cdi; the state directories survive.
func (e *env) reboot(t *testing.T) {
	t.Helper()
	if err := os.RemoveAll(e.cdiDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(e.cdiDir, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestPrepareRewritesSpec: preparing a completed claim again writes its CDI
// spec back when it is missing or was changed, byte for byte as first
// written, and leaves an intact one untouched.
func TestPrepareRewritesSpec(t *testing.T) {
	tests := []struct {
		name   string
		damage func(t *testing.T, path string)
	}{
		{name: "deleted", damage: func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "changed", damage: func(t *testing.T, path string) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			// Another GPU's node added to the claim's device.
			b = bytes.Replace(b, []byte(`"/dev/nvidia3"`), []byte(`"/dev/nvidia5"`), 1)
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "emptied", damage: func(t *testing.T, path string) {
			if err := os.WriteFile(path, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, "dgx1-volta")
			d, a := e.driver(t)
			first, err := d.Prepare(t.Context(), claim("u1", "gpu-3"))
			if err != nil {
				t.Fatal(err)
			}
			path, want := e.specOf(t, d, "u1")
			if want == nil {
				t.Fatal("no CDI spec after the first prepare")
			}
			tt.damage(t, path)
			again, err := d.Prepare(t.Context(), claim("u1", "gpu-3"))
			if err != nil {
				t.Fatal(err)
			}
			if len(again) != 1 || !slices.Equal(again[0].CDIDeviceIDs, first[0].CDIDeviceIDs) {
				t.Errorf("prepare again = %+v, want %+v", again, first)
			}
			if _, got := e.specOf(t, d, "u1"); !bytes.Equal(got, want) {
				t.Errorf("CDI spec after preparing again:\n%s\nwant:\n%s", got, want)
			}
			e.checkPrepared(t, d, a, "u1", again, []string{e.inv.Devices[3].UUID})

			// An intact spec is left as it is (the same file, not a
			// replacement).
			before, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := d.Prepare(t.Context(), claim("u1", "gpu-3")); err != nil {
				t.Fatal(err)
			}
			if after, err := os.Stat(path); err != nil || !os.SameFile(before, after) {
				t.Errorf("an intact CDI spec was replaced (%v)", err)
			}
		})
	}
}

// TestRestoreAfterReboot: a driver started after a reboot (the CDI
// directory empty, checkpoints and the allocator's state kept) writes every
// prepared claim's spec again before anything is asked of it, as it was;
// a cut-short claim is left for its next prepare, a corrupt checkpoint is
// reported and left as it is, and neither stops the others.
func TestRestoreAfterReboot(t *testing.T) {
	e := newEnv(t, "hgx-h100-mig")
	d1, a1 := e.driver(t)
	mig := firstMIG(e.inv, "1g.10gb")
	whole := -1
	for i, dev := range e.inv.Devices {
		if !dev.MIGSplit() {
			whole = i
			break
		}
	}
	if whole < 0 {
		t.Fatal("the simulated node has no whole GPU")
	}
	if _, err := d1.Prepare(t.Context(), claim("gpu", dra.DeviceName(e.inv.Devices[whole]))); err != nil {
		t.Fatal(err)
	}
	if _, err := d1.Prepare(t.Context(), claim("mig", dra.MIGDeviceName(mig))); err != nil {
		t.Fatal(err)
	}
	_, wantGPU := e.specOf(t, d1, "gpu")
	_, wantMIG := e.specOf(t, d1, "mig")
	if err := dra.WriteCheckpoint(e.stateDir, dra.Checkpoint{UID: "cut", State: dra.StatePrepareStarted, Owner: "claim-cut",
		Devices: []dra.PreparedDevice{{Requests: []string{"r0"}, Pool: "node-1", Device: "gpu-x", UUID: "GPU-none"}}}); err != nil {
		t.Fatal(err)
	}
	corrupt := filepath.Join(e.stateDir, "bad.json")
	if err := os.WriteFile(corrupt, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	a1.Close()

	e.reboot(t)
	d2, a2 := e.driver(t)
	written, err := d2.Restore(t.Context())
	if !slices.Equal(written, []string{"gpu", "mig"}) {
		t.Errorf("restored %v, want [gpu mig]", written)
	}
	if !errors.Is(err, dra.ErrCorruptCheckpoint) {
		t.Errorf("restore: %v, want the corrupt checkpoint reported", err)
	}
	if _, got := e.specOf(t, d2, "gpu"); !bytes.Equal(got, wantGPU) {
		t.Errorf("the GPU claim's spec after the reboot:\n%s\nwant:\n%s", got, wantGPU)
	}
	if _, got := e.specOf(t, d2, "mig"); !bytes.Equal(got, wantMIG) {
		t.Errorf("the MIG claim's spec after the reboot:\n%s\nwant:\n%s", got, wantMIG)
	}
	if _, got := e.specOf(t, d2, "cut"); got != nil {
		t.Error("a spec was written for a claim whose preparation was cut short")
	}
	if b, _ := os.ReadFile(corrupt); string(b) != "{" {
		t.Error("the corrupt checkpoint changed")
	}
	for _, uid := range []string{"gpu", "mig"} {
		if _, err := a2.Allocation("claim-" + uid); err != nil {
			t.Errorf("claim %s: %v", uid, err)
		}
	}

	// A second start finds nothing to write.
	if written, _ := d2.Restore(t.Context()); len(written) != 0 {
		t.Errorf("restore again wrote %v", written)
	}
	// The kubelet then unprepares as usual.
	for _, uid := range []string{"gpu", "mig"} {
		if err := d2.Unprepare(t.Context(), uid); err != nil {
			t.Fatal(err)
		}
		e.checkGone(t, d2, a2, uid)
	}
}

// TestRestoreRefusesTakenDevice: a prepared claim whose hold the allocator
// lost is held again when its devices are free, and refused (reported, no
// spec) when another owner has one now; the other claims are restored.
func TestRestoreRefusesTakenDevice(t *testing.T) {
	e := newEnv(t, "dgx1-volta")
	d1, a1 := e.driver(t)
	for uid, dev := range map[string]string{"lost": "gpu-1", "taken": "gpu-2", "kept": "gpu-3"} {
		if _, err := d1.Prepare(t.Context(), claim(uid, dev)); err != nil {
			t.Fatal(err)
		}
	}
	// The allocator forgets two holds; another owner takes one GPU.
	for _, o := range []string{"claim-lost", "claim-taken"} {
		if err := a1.Release(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a1.Allocate(t.Context(), "thief", allocator.Request{Devices: []string{e.inv.Devices[2].UUID}}); err != nil {
		t.Fatal(err)
	}
	a1.Close()

	e.reboot(t)
	d2, a2 := e.driver(t)
	written, err := d2.Restore(t.Context())
	if !slices.Equal(written, []string{"kept", "lost"}) {
		t.Errorf("restored %v, want [kept lost]", written)
	}
	if !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Errorf("restore: %v, want the taken GPU reported", err)
	}
	if _, got := e.specOf(t, d2, "taken"); got != nil {
		t.Error("a spec was written for a claim whose GPU another owner holds")
	}
	if al, err := a2.Allocation("thief"); err != nil || len(al.Devices) != 1 {
		t.Errorf("the other owner's hold: %+v, %v", al, err)
	}
	if _, err := d2.Prepare(t.Context(), claim("taken", "gpu-2")); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Errorf("prepare of the claim whose GPU is taken: %v", err)
	}
	devs, err := d2.Prepare(t.Context(), claim("lost", "gpu-1"))
	if err != nil {
		t.Fatal(err)
	}
	e.checkPrepared(t, d2, a2, "lost", devs, []string{e.inv.Devices[1].UUID})
}

// TestForeignOwnerCheckpoint: a checkpoint that passes its checksum but
// names an owner other than its claim's is refused, so that neither a
// prepare nor an unprepare releases another owner's GPUs or removes its
// spec.
func TestForeignOwnerCheckpoint(t *testing.T) {
	e := newEnv(t, "dgx1-volta")
	d, a := e.driver(t)
	uuid := e.inv.Devices[0].UUID
	if _, err := a.Allocate(t.Context(), "victim", allocator.Request{Devices: []string{uuid}}); err != nil {
		t.Fatal(err)
	}
	if err := dra.WriteCheckpoint(e.stateDir, dra.Checkpoint{UID: "bad", State: dra.StatePrepareStarted, Owner: "victim",
		Devices: []dra.PreparedDevice{{Requests: []string{"r0"}, Pool: "node-1", Device: "gpu-0", UUID: uuid}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Prepare(t.Context(), claim("bad", "gpu-1")); !errors.Is(err, dra.ErrCorruptCheckpoint) {
		t.Errorf("prepare: %v", err)
	}
	if err := d.Unprepare(t.Context(), "bad"); !errors.Is(err, dra.ErrCorruptCheckpoint) {
		t.Errorf("unprepare: %v", err)
	}
	if _, err := d.Restore(t.Context()); !errors.Is(err, dra.ErrCorruptCheckpoint) {
		t.Errorf("restore: %v", err)
	}
	if al, err := a.Allocation("victim"); err != nil || len(al.Devices) != 1 {
		t.Errorf("the other owner's hold: %+v, %v", al, err)
	}
}

// TestFileModes: whatever the umask, the state directory and the
// checkpoints are the plugin's alone (0700, 0600), and a claim's CDI spec
// is readable by the runtimes and writable by root only (0644).
func TestFileModes(t *testing.T) {
	for _, umask := range []int{0, 0o022} {
		t.Run(fmt.Sprintf("umask %04o", umask), func(t *testing.T) {
			old := syscall.Umask(umask)
			defer syscall.Umask(old)
			e := newEnv(t, "dgx1-volta")
			d, _ := e.driver(t)
			if _, err := d.Prepare(t.Context(), claim("u1", "gpu-0")); err != nil {
				t.Fatal(err)
			}
			spec, _ := e.specOf(t, d, "u1")
			for path, want := range map[string]os.FileMode{
				e.stateDir: os.ModeDir | 0o700, filepath.Join(e.stateDir, "u1.json"): 0o600, spec: 0o644,
			} {
				fi, err := os.Stat(path)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode() != want {
					t.Errorf("%s: mode %v, want %v", path, fi.Mode(), want)
				}
			}
		})
	}
}
