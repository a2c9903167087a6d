package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator/mps"
)

// TestRequestSlices: GPUISO_GPU_SLICES asks for a concurrent slice and
// GPUISO_GPU_TIME_SLICE for a time slice, trusted as GPUISO_GPU_MEMORY is:
// the caller's setting asks, the image's own never does; two kinds at once,
// a compute percentage beside a slice, or a count out of range is
// ErrInvalidShare.
func TestRequestSlices(t *testing.T) {
	spec := func(env ...string) *specs.Spec { return &specs.Spec{Process: &specs.Process{Env: env}} }
	plain := &engineRecord{Engine: "docker"}
	imageSlices := &engineRecord{Engine: "docker", ImageEnv: []string{"GPUISO_GPU_SLICES=2", "GPUISO_GPU_TIME_SLICE=1"}}
	for _, tc := range []struct {
		name    string
		spec    *specs.Spec
		rec     *engineRecord
		want    *allocator.Share
		source  string
		ids     []string
		ignored string
		err     bool
	}{
		{name: "caller's slice", spec: spec("GPUISO_GPU_SLICES=4"), rec: plain, want: &allocator.Share{Mode: allocator.ShareSlice, Slices: 4}, source: "GPUISO_GPU_SLICES"},
		{name: "caller's slice of GPU 2", spec: spec("GPUISO_GPU_SLICES=8", "NVIDIA_VISIBLE_DEVICES=2"), rec: plain, want: &allocator.Share{Mode: allocator.ShareSlice, Slices: 8}, source: "GPUISO_GPU_SLICES", ids: []string{"2"}},
		{name: "caller's time slice", spec: spec("GPUISO_GPU_TIME_SLICE=true"), rec: plain, want: &allocator.Share{Mode: allocator.ShareTime}, source: "GPUISO_GPU_TIME_SLICE"},
		{name: "time slice off", spec: spec("GPUISO_GPU_TIME_SLICE=0"), rec: plain},
		{name: "image's slices", spec: spec("GPUISO_GPU_SLICES=2", "GPUISO_GPU_TIME_SLICE=1"), rec: imageSlices, ignored: "GPUISO_GPU_SLICES=2: the image's own"},
		{name: "image's slices under the caller's", spec: spec("GPUISO_GPU_SLICES=4"), rec: imageSlices, want: &allocator.Share{Mode: allocator.ShareSlice, Slices: 4}, source: "GPUISO_GPU_SLICES"},
		{name: "no record", spec: spec("GPUISO_GPU_SLICES=4"), ignored: "GPUISO_GPU_SLICES=4: no record"},
		{name: "one slice", spec: spec("GPUISO_GPU_SLICES=1"), rec: plain, err: true},
		{name: "49 slices", spec: spec("GPUISO_GPU_SLICES=49"), rec: plain, err: true},
		{name: "slices not a number", spec: spec("GPUISO_GPU_SLICES=four"), rec: plain, err: true},
		{name: "time slice maybe", spec: spec("GPUISO_GPU_TIME_SLICE=maybe"), rec: plain, err: true},
		{name: "slices and memory", spec: spec("GPUISO_GPU_MEMORY=1GiB", "GPUISO_GPU_SLICES=4"), rec: plain, err: true},
		{name: "slices and time slice", spec: spec("GPUISO_GPU_SLICES=4", "GPUISO_GPU_TIME_SLICE=1"), rec: plain, err: true},
		{name: "compute of a slice", spec: spec("GPUISO_GPU_SLICES=4", "GPUISO_GPU_COMPUTE=50"), rec: plain, err: true},
		{name: "slice of two GPUs", spec: spec("GPUISO_GPU_SLICES=4", "NVIDIA_VISIBLE_DEVICES=0,1"), rec: plain, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := &trust{Policy: AcceptCaller, Load: func() (*engineRecord, error) {
				if tc.rec == nil {
					return nil, errors.New("no record here")
				}
				return tc.rec, nil
			}}
			r, err := requestOf(tc.spec, "nvidia.com/gpu", testSwarm(), tr)
			if tc.err {
				if !errors.Is(err, ErrInvalidShare) {
					t.Fatalf("requestOf = %+v, %v; want ErrInvalidShare", r, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.want == nil && r.Share != nil:
				t.Errorf("share %+v from %q, want none", *r.Share, r.ShareSource)
			case tc.want != nil && (r.Share == nil || *r.Share != *tc.want || r.ShareSource != tc.source):
				t.Errorf("share %+v from %q, want %+v from %q", r.Share, r.ShareSource, tc.want, tc.source)
			}
			if strings.Join(r.IDs, ",") != strings.Join(tc.ids, ",") {
				t.Errorf("devices %+v, want %q", r.Devices, tc.ids)
			}
			if got := strings.Join(r.Ignored, "; "); tc.ignored == "" && got != "" || !strings.Contains(got, tc.ignored) {
				t.Errorf("ignored %q, want %q", got, tc.ignored)
			}
			if tc.want != nil {
				if al := r.allocation(nil); al.Share == nil || *al.Share != *tc.want || al.Count != 0 {
					t.Errorf("allocation %+v", al)
				}
			}
		})
	}
}

// TestSliceRunc: two containers asking for a concurrent slice of 4
// (GPUISO_GPU_SLICES=4) get slices of one GPU under one MPS daemon, which
// holds a quarter of the GPU's memory and which both containers reach at
// their /tmp/nvidia-mps; the delete of the first leaves the daemon to the
// second, the delete of the second stops it.
func TestSliceRunc(t *testing.T) {
	r := newShareRig(t)
	id := fmt.Sprintf("gpuiso-slice-%d", time.Now().UnixNano())
	a, b := r.owner(t, id, r.root), r.owner(t, id+"-b", r.root)
	r.forget(t, id, r.root)
	r.forget(t, id+"-b", r.root)
	for _, name := range []string{id, id + "-b"} {
		dir := sleepBundle(t, r.probe, "all")
		addEnv(t, dir, "GPUISO_GPU_SLICES=4")
		if out, err := r.run(t, r.root, "create", "--bundle", dir, name); err != nil {
			t.Fatalf("create %s: %v\n%s", name, err, out)
		}
	}
	got := owners(t, r.state)
	if len(got[a]) != 1 || len(got[b]) != 1 || got[a][0] != got[b][0] {
		t.Fatalf("owners %v: want %s and %s slicing one GPU", got, a, b)
	}
	list, err := mps.Daemons(context.Background(), filepath.Join(r.state, daemonsDir))
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Slices != 4 || list[0].Index != got[a][0] || list[0].Owner != mps.SliceOwner(list[0].GPU) {
		t.Fatalf("daemons %+v: want the one of gpu %d's slices", list, got[a][0])
	}
	d := list[0]
	expectShare(t, initPid(t, r.root, id), d, 4096) // 16 GiB in 4
	expectShare(t, initPid(t, r.root, id+"-b"), d, 4096)
	out, err := exec.Command("runc", "--root", r.root, "exec", id, "/probe", "do", "env", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25\n") || !strings.Contains(string(out), "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M\n") {
		t.Errorf("the container's limits: %v:\n%s", err, out)
	}
	if out, err := r.run(t, r.root, "delete", "--force", id); err != nil {
		t.Fatalf("delete: %v\n%s", err, out)
	}
	r.expectReleased(t, a)
	if still, ok := daemonOf(t, r.state, d.Owner); !ok || !still.Alive || still.Pid != d.Pid {
		t.Fatalf("the slices' daemon after the first delete: %+v, want %d running", still, d.Pid)
	}
	if out, err := r.run(t, r.root, "delete", "--force", id+"-b"); err != nil {
		t.Fatalf("delete: %v\n%s", err, out)
	}
	r.expectReleased(t, b)
	expectDaemonGone(t, d)
	expectNoDaemons(t, r.state)
}

// FuzzRequestSlices: any GPUISO_GPU_SLICES and GPUISO_GPU_TIME_SLICE,
// beside any GPUISO_GPU_MEMORY and GPUISO_GPU_COMPUTE, give one valid
// share of at most one GPU, or ErrInvalidShare, never a panic or a share
// the allocator refuses.
func FuzzRequestSlices(f *testing.F) {
	for _, s := range [][4]string{{"4", "", "", ""}, {"", "1", "", ""}, {"2", "true", "", ""}, {"48", "", "1GiB", ""}, {"4", "", "", "50"}, {"49", "", "", ""}, {"-1", "0", "", ""}, {" 8 ", "false", "", ""}} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	f.Fuzz(func(t *testing.T, slices, timeSlice, memory, compute string) {
		var env []string
		for k, v := range map[string]string{"GPUISO_GPU_SLICES": slices, "GPUISO_GPU_TIME_SLICE": timeSlice, "GPUISO_GPU_MEMORY": memory, "GPUISO_GPU_COMPUTE": compute} {
			if v != "" {
				env = append(env, k+"="+v)
			}
		}
		r, err := requestOf(&specs.Spec{Process: &specs.Process{Env: env}}, "nvidia.com/gpu", testSwarm(), &trust{Policy: AcceptAlways})
		if err != nil {
			if !errors.Is(err, ErrInvalidShare) {
				t.Fatalf("%q: %v is no ErrInvalidShare", env, err)
			}
			return
		}
		if r.Share == nil {
			return
		}
		if err := r.Share.Validate(); err != nil || len(r.IDs) > 1 {
			t.Fatalf("%q: share %+v, devices %+v: %v", env, *r.Share, r.Devices, err)
		}
		if r.Share.Mode != allocator.ShareMemory && r.Share.ComputePercent != 0 {
			t.Fatalf("%q: a %s share with a compute percentage", env, r.Share.Mode)
		}
	})
}
