package dra_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
)

const (
	timeConfig  = `{"apiVersion":"gpu.gpuiso.io/v1","kind":"GPUConfig","sharing":{"strategy":"TimeSlicing"}}`
	sliceConfig = `{"apiVersion":"gpu.gpuiso.io/v1","kind":"GPUConfig","sharing":{"strategy":"MPS","mps":{"slices":%d}}}`
)

// specEdits are the mounts (container path to host path) and environment
// of owner's CDI spec.
func (e *shareEnv) specEdits(t *testing.T, d *dra.Driver, owner string) (map[string]string, map[string]string) {
	t.Helper()
	path, _ := cdi.Writer{Dir: e.cdiDir}.AllocationPath(d.CDIKind(), owner)
	spec, err := cdi.ValidateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	edits := spec.Devices[0].ContainerEdits
	mounts, env := map[string]string{}, map[string]string{}
	for _, mt := range edits.Mounts {
		mounts[mt.ContainerPath] = mt.HostPath
	}
	for _, kv := range edits.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return mounts, env
}

// TestPrepareTimeSlices: a claim of the share device configured
// TimeSlicing is a time slice of the GPU: the allocator holds it as one,
// the CDI spec gives the GPU with no MPS daemon, and no daemon runs. The
// GPU takes DefaultTimeSlices of them and no fifth, nor a memory share
// while they hold it; they survive a restart of the driver and leave
// nothing once unprepared.
func TestPrepareTimeSlices(t *testing.T) {
	e := newShareEnv(t)
	d, a, _ := e.driver(t)
	share := dra.ShareDeviceName(e.gpu())
	var claims []*resourceapi.ResourceClaim
	for i := range allocator.DefaultTimeSlices {
		c := shareClaim(fmt.Sprintf("t%d", i), share, 1*gib, timeConfig)
		devs, err := d.Prepare(t.Context(), c)
		if err != nil {
			t.Fatalf("time slice %d: %v", i, err)
		}
		e.checkPrepared(t, d, a, string(c.UID), devs, []string{e.gpu().UUID})
		if len(devs) != 1 || devs[0].ShareID == nil {
			t.Errorf("result %+v, want a share id", devs)
		}
		al, err := a.Allocation("claim-" + string(c.UID))
		if err != nil || al.Share == nil || al.Share.Mode != allocator.ShareTime {
			t.Errorf("allocator holds %+v, %v, want a time slice", al, err)
		}
		mounts, env := e.specEdits(t, d, "claim-"+string(c.UID))
		if len(mounts) != 0 || env["CUDA_MPS_PIPE_DIRECTORY"] != "" || env["CUDA_VISIBLE_DEVICES"] != e.gpu().UUID {
			t.Errorf("a time slice's spec has mounts %v and env %v, want the GPU alone", mounts, env)
		}
		claims = append(claims, c)
	}
	if ds := e.daemons(t); len(ds) != 0 {
		t.Errorf("time slices started daemons: %v", ds)
	}
	for _, c := range []*resourceapi.ResourceClaim{shareClaim("t9", share, 1*gib, timeConfig), shareClaim("m9", share, 2*gib)} {
		if _, err := d.Prepare(t.Context(), c); !errors.Is(err, allocator.ErrDeviceUnavailable) {
			t.Errorf("%s beside %d time slices: %v, want the GPU unavailable", c.UID, len(claims), err)
		}
		e.checkGone(t, d, a, string(c.UID))
	}

	d2, a2, _ := e.driver(t)
	if _, err := d2.Restore(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, c := range claims {
		devs, err := d2.Prepare(t.Context(), c)
		if err != nil {
			t.Fatalf("prepare %s again after a restart: %v", c.UID, err)
		}
		e.checkPrepared(t, d2, a2, string(c.UID), devs, []string{e.gpu().UUID})
		if err := d2.Unprepare(t.Context(), string(c.UID)); err != nil {
			t.Fatal(err)
		}
		e.checkGone(t, d2, a2, string(c.UID))
	}
	if shares, _ := a2.Shares(e.gpu().UUID); len(shares) != 0 {
		t.Errorf("shares left: %v", shares)
	}
}

// TestPrepareConcurrentSlices: claims configured MPS with mps.slices 4 are
// concurrent slices of the GPU under its one MPS daemon: each spec gives
// that daemon's pipe and shm directories, the allocator holds each as a
// slice of a quarter of the GPU's memory, and the GPU takes no fifth, no
// slice of another count and no time slice. A restarted driver restores
// them with the same daemon; unpreparing a slice drops it from the daemon,
// which stops with the last.
func TestPrepareConcurrentSlices(t *testing.T) {
	e := newShareEnv(t)
	d, a, _ := e.driver(t)
	share := dra.ShareDeviceName(e.gpu())
	owner := mps.SliceOwner(e.gpu().UUID)
	var claims []*resourceapi.ResourceClaim
	for i := range 4 {
		c := shareClaim(fmt.Sprintf("c%d", i), share, 1*gib, fmt.Sprintf(sliceConfig, 4))
		devs, err := d.Prepare(t.Context(), c)
		if err != nil {
			t.Fatalf("slice %d: %v", i, err)
		}
		e.checkPrepared(t, d, a, string(c.UID), devs, []string{e.gpu().UUID})
		al, err := a.Allocation("claim-" + string(c.UID))
		if err != nil || al.Share == nil || al.Share.Mode != allocator.ShareSlice || al.Share.Slices != 4 || al.Share.MemoryBytes != e.gpu().MemoryBytes/4 {
			t.Errorf("allocator holds %+v, %v, want a slice of 4", al.Share, err)
		}
		dm, ok := e.daemons(t)[owner]
		if !ok || !dm.Alive || dm.Slices != 4 || dm.GPU != e.gpu().UUID {
			t.Fatalf("no running daemon of the GPU's slices: %+v", e.daemons(t))
		}
		mounts, env := e.specEdits(t, d, "claim-"+string(c.UID))
		if mounts["/tmp/nvidia-mps"] != dm.PipeDir || mounts["/dev/shm"] != dm.ShmDir || len(mounts) != 2 || env["CUDA_MPS_PIPE_DIRECTORY"] != "/tmp/nvidia-mps" {
			t.Errorf("mounts %v env %v, want the slice daemon's pipe %s and shm %s", mounts, env, dm.PipeDir, dm.ShmDir)
		}
		claims = append(claims, c)
	}
	ds := e.daemons(t)
	if len(ds) != 1 {
		t.Errorf("daemons %v, want the GPU's one", ds)
	}
	pid := ds[owner].Pid
	for _, c := range []*resourceapi.ResourceClaim{
		shareClaim("c9", share, 1*gib, fmt.Sprintf(sliceConfig, 4)),
		shareClaim("c8", share, 1*gib, fmt.Sprintf(sliceConfig, 2)),
		shareClaim("t8", share, 1*gib, timeConfig),
	} {
		if _, err := d.Prepare(t.Context(), c); !errors.Is(err, allocator.ErrDeviceUnavailable) {
			t.Errorf("%s beside 4 slices of 4: %v, want the GPU unavailable", c.UID, err)
		}
		e.checkGone(t, d, a, string(c.UID))
	}

	d2, a2, _ := e.driver(t)
	if _, err := d2.Restore(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, c := range claims {
		if _, err := d2.Prepare(t.Context(), c); err != nil {
			t.Fatalf("prepare %s again after a restart: %v", c.UID, err)
		}
	}
	if dm := e.daemons(t)[owner]; dm.Pid != pid || !dm.Alive {
		t.Errorf("after a restart the daemon is %+v, was pid %d", dm, pid)
	}
	for i, c := range claims {
		if err := d2.Unprepare(t.Context(), string(c.UID)); err != nil {
			t.Fatal(err)
		}
		e.checkGone(t, d2, a2, string(c.UID))
		dm, ok := e.daemons(t)[owner]
		if last := i == len(claims)-1; last == ok {
			t.Fatalf("after unpreparing %d of %d slices the daemon is %+v (running %v)", i+1, len(claims), dm, ok)
		}
		if ok && dm.Pid != pid {
			t.Errorf("unpreparing a slice changed the daemon: pid %d, was %d", dm.Pid, pid)
		}
	}
	if _, err := os.Stat(ds[owner].Dir); !os.IsNotExist(err) {
		t.Errorf("the slices' daemon directory is left: %v", err)
	}
}

// TestPrepareSliceConfig: a slice's configuration that does not hold,
// alone or merged (a class's compute percentage and a claim's count), is
// refused, leaving nothing.
func TestPrepareSliceConfig(t *testing.T) {
	e := newShareEnv(t)
	d, a, _ := e.driver(t)
	share := dra.ShareDeviceName(e.gpu())
	for _, tt := range []struct {
		name string
		c    *resourceapi.ResourceClaim
		want string
	}{
		{"one slice", shareClaim("b1", share, gib, fmt.Sprintf(sliceConfig, 1)), "sharing.mps.slices"},
		{"49 slices", shareClaim("b2", share, gib, fmt.Sprintf(sliceConfig, 49)), "sharing.mps.slices"},
		{"compute and slices", shareClaim("b3", share, gib, `{"computePercent":40}`, fmt.Sprintf(sliceConfig, 4)), "sharing.mps.slices"},
		{"time slice with limits", shareClaim("b4", share, gib, `{"computePercent":40}`, timeConfig), "sharing.mps"},
		{"time slice of a whole GPU", func() *resourceapi.ResourceClaim {
			c := claim("b5", "gpu-3")
			c.Status.Allocation.Devices.Config = shareClaim("b5", share, gib, timeConfig).Status.Allocation.Devices.Config
			return c
		}(), "sharing.strategy"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := d.Prepare(t.Context(), tt.c)
			var ce *dra.ConfigError
			if !errors.As(err, &ce) || ce.Field != tt.want || !errors.Is(err, dra.ErrInvalidDeviceConfig) {
				t.Fatalf("err = %v, want a configuration error of %s", err, tt.want)
			}
			e.checkGone(t, d, a, string(tt.c.UID))
			if len(e.daemons(t)) > 0 {
				t.Errorf("daemons left: %v", e.daemons(t))
			}
		})
	}
}

// TestCheckpointShareKinds: a checkpoint keeps the kind of its share (a
// memory share without a mode, as before); one whose share is no share
// the driver prepares is corrupt.
func TestCheckpointShareKinds(t *testing.T) {
	dev := []dra.PreparedDevice{{Requests: []string{"gpu"}, Pool: "node", Device: "share-0", UUID: "GPU-0", ShareID: "s"}}
	for _, tt := range []struct {
		name  string
		share dra.PreparedShare
		ok    bool
	}{
		{"memory share", dra.PreparedShare{MemoryBytes: gib, ComputePercent: 50}, true},
		{"time slice", dra.PreparedShare{Mode: allocator.ShareTime}, true},
		{"concurrent slice", dra.PreparedShare{Mode: allocator.ShareSlice, Slices: 4}, true},
		{"unknown mode", dra.PreparedShare{Mode: "bogus", Slices: 4}, false},
		{"one slice", dra.PreparedShare{Mode: allocator.ShareSlice, Slices: 1}, false},
		{"slice with compute", dra.PreparedShare{Mode: allocator.ShareSlice, Slices: 4, ComputePercent: 10}, false},
		{"slice with memory", dra.PreparedShare{Mode: allocator.ShareSlice, Slices: 4, MemoryBytes: gib}, false},
		{"time slice with memory", dra.PreparedShare{Mode: allocator.ShareTime, MemoryBytes: gib}, false},
		{"memory share of no memory", dra.PreparedShare{}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			sh := tt.share
			cp := dra.Checkpoint{UID: "u", Namespace: "ns", Name: "c", State: dra.StatePrepareCompleted, Owner: "claim-u", Devices: dev, Share: &sh}
			if err := dra.WriteCheckpoint(dir, cp); err != nil {
				t.Fatal(err)
			}
			got, err := dra.ReadCheckpoint(dir, "u")
			if !tt.ok {
				if !errors.Is(err, dra.ErrCorruptCheckpoint) {
					t.Fatalf("read %+v: %v, want ErrCorruptCheckpoint", got.Share, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Share == nil || *got.Share != tt.share {
				t.Errorf("read share %+v, want %+v", got.Share, tt.share)
			}
		})
	}
}
