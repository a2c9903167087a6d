package simnode_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// TestMIGLayoutRejects: layouts that break the GPU's slice rules are
// refused when the topology is read.
func TestMIGLayoutRejects(t *testing.T) {
	spec := `{"name":"x","gpu":{"model":"H100","brand":"NVIDIA","architecture":"hopper","computeCapability":"9.0","memoryMiB":81559%s},"gpus":[{"busId":"0000:06:00.0","numaNode":0,"hostBridge":0,"mig":{"instances":[%s]}}]}`
	h100 := `,"migCapable":true,"migProfiles":"h100-80gb"`
	tests := map[string]string{
		"unknown profile":     fmt.Sprintf(spec, h100, `{"profile":"1g.5gb"}`),
		"overlap":             fmt.Sprintf(spec, h100, `{"profile":"3g.40gb","start":0},{"profile":"4g.40gb"}`),
		"bad start":           fmt.Sprintf(spec, h100, `{"profile":"3g.40gb","start":2}`),
		"too many":            fmt.Sprintf(spec, h100, strings.Repeat(`{"profile":"2g.20gb"},`, 3)+`{"profile":"2g.20gb"}`),
		"one +me only":        fmt.Sprintf(spec, h100, `{"profile":"1g.10gb+me"},{"profile":"1g.10gb+me"}`),
		"full after 7g":       fmt.Sprintf(spec, h100, `{"profile":"7g.80gb"},{"profile":"1g.10gb"}`),
		"not MIG capable":     fmt.Sprintf(spec, "", `{"profile":"1g.10gb"}`),
		"unknown table":       fmt.Sprintf(spec, `,"migCapable":true,"migProfiles":"b300"`, ``),
		"table without MIG":   fmt.Sprintf(spec, `,"migProfiles":"h100-80gb"`, ``),
		"eighth single slice": fmt.Sprintf(spec, h100, strings.Repeat(`{"profile":"1g.10gb"},`, 7)+`{"profile":"1g.10gb"}`),
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := simnode.ParseSpec(strings.NewReader(in))
			if !errors.Is(err, simnode.ErrInvalidSpec) {
				t.Fatalf("ParseSpec = %v, want ErrInvalidSpec", err)
			}
		})
	}
	ok := fmt.Sprintf(spec, h100, `{"profile":"4g.40gb"},{"profile":"2g.20gb"},{"profile":"1g.10gb"}`)
	s, err := simnode.ParseSpec(strings.NewReader(ok))
	if err != nil {
		t.Fatal(err)
	}
	sim, err := simnode.NewFromSpec(s)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range sim.MIGDevices(0) {
		got = append(got, fmt.Sprintf("%s@%d:%d gi%d", m.Profile, m.Start, m.Size, m.GI))
	}
	if want := "4g.40gb@0:4 gi1 2g.20gb@4:2 gi5 1g.10gb@6:1 gi13"; strings.Join(got, " ") != want {
		t.Fatalf("layout %q, want %q", strings.Join(got, " "), want)
	}
}

// TestMIGNVML: the MIG calls answer as a driver does: profile info by
// index with NVML's profile ids, placements, MIG device handles with their
// parent, instance ids and a name, and lookup by MIG UUID.
func TestMIGNVML(t *testing.T) {
	sim, err := simnode.New("hgx-h100-mig")
	if err != nil {
		t.Fatal(err)
	}
	lib := sim.NVML()
	parent, _ := lib.DeviceGetHandleByIndex(1)
	if cur, _, ret := parent.GetMigMode(); ret != nvml.SUCCESS || cur != nvml.DEVICE_MIG_ENABLE {
		t.Fatalf("GetMigMode = %d, %v", cur, ret)
	}
	info, ret := parent.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_3_SLICE)
	if ret != nvml.SUCCESS || info.Id != 9 || info.InstanceCount != 2 || info.MemorySizeMB != 40448 {
		t.Fatalf("3-slice profile = %+v, %v", info, ret)
	}
	if pl, ret := parent.GetGpuInstancePossiblePlacements(&info); ret != nvml.SUCCESS || len(pl) != 2 || pl[1] != (nvml.GpuInstancePlacement{Start: 4, Size: 4}) {
		t.Fatalf("placements = %v, %v", pl, ret)
	}
	if _, ret := parent.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_6_SLICE); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Fatalf("6-slice profile: %v, want NOT_SUPPORTED", ret)
	}
	mh, ret := parent.GetMigDeviceHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	uuid, _ := mh.GetUUID()
	gi, _ := mh.GetGpuInstanceId()
	name, _ := mh.GetName()
	back, _ := mh.GetDeviceHandleFromMigDeviceHandle()
	if uuid != sim.MIGUUID(1, 1, 0) || gi != 1 || name != "NVIDIA H100 80GB HBM3 MIG 3g.40gb" || back != parent {
		t.Fatalf("MIG device 0 = %s gi %d %q", uuid, gi, name)
	}
	if h, ret := lib.DeviceGetHandleByUUID(uuid); ret != nvml.SUCCESS || h != mh {
		t.Fatalf("handle by MIG UUID = %v", ret)
	}
	if _, ret := parent.GetMigDeviceHandleByIndex(3); ret != nvml.ERROR_NOT_FOUND {
		t.Fatalf("fourth MIG device of three: %v", ret)
	}
	whole, _ := lib.DeviceGetHandleByIndex(5)
	if cur, _, _ := whole.GetMigMode(); cur != nvml.DEVICE_MIG_DISABLE {
		t.Fatal("GPU 5 has MIG enabled")
	}
	if err := sim.Lose(1); err != nil {
		t.Fatal(err)
	}
	if _, ret := mh.GetUUID(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Fatalf("MIG device of a lost GPU: %v", ret)
	}
	if err := sim.InjectMIGXID(1, 9, 0, 48); !errors.Is(err, simnode.ErrNoSuchMIGDevice) {
		t.Fatalf("InjectMIGXID(no such instance) = %v", err)
	}
}

// TestMakeHostMIG: the simulated host has the nvidia-caps side of a MIG
// node: its major in /proc/devices, the mig-minors table, capability files
// and nodes for config, monitor and each instance.
func TestMakeHostMIG(t *testing.T) {
	testenv.RequireRoot(t)
	sim, _ := simnode.New("dgx-a100-mig")
	h, err := sim.MakeHost(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Remove()
	majors, err := node.ReadProcDevices(h.ProcRoot)
	if err != nil || majors[node.NVIDIACaps] != h.CapsMajor || h.CapsMajor == h.NVIDIAMajor || h.CapsMajor == h.UVMMajor {
		t.Fatalf("nvidia-caps major %d (%v), host %d", majors[node.NVIDIACaps], err, h.CapsMajor)
	}
	b, err := os.ReadFile(filepath.Join(h.ProcRoot, "driver", "nvidia-caps", "mig-minors"))
	if err != nil {
		t.Fatal(err)
	}
	minors, err := node.ParseMIGMinors(string(b))
	if err != nil || minors["config"] != 1 || minors["monitor"] != 2 || len(minors) != 2+8*15*9 {
		t.Fatalf("mig-minors: %d entries, %v", len(minors), err)
	}
	want := 2
	for i := range sim.Len() {
		for _, m := range sim.MIGDevices(i) {
			want += 2
			for _, name := range []string{node.MIGGIAccessName(sim.Minor(i), m.GI), node.MIGCIAccessName(sim.Minor(i), m.GI, m.CI)} {
				num, err := linux.StatDevice(filepath.Join(h.DevRoot, "nvidia-caps", fmt.Sprintf("nvidia-cap%d", minors[name])))
				if err != nil || num != (linux.DeviceNumber{Char: true, Major: h.CapsMajor, Minor: minors[name]}) {
					t.Errorf("%s: %+v, %v", name, num, err)
				}
			}
		}
	}
	entries, _ := os.ReadDir(filepath.Join(h.DevRoot, "nvidia-caps"))
	if len(entries) != want {
		t.Fatalf("%d capability nodes, want %d", len(entries), want)
	}
}

// TestMIGManagerHost: a MIG device created on a simulated host gets its
// capability files and nodes, is refused where the GPU has no room or MIG
// is off, and takes them along when destroyed.
func TestMIGManagerHost(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	sim, _ := simnode.New("dgx-a100-mig")
	h, err := sim.MakeHost(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Remove()
	m := sim.MIGManager(h)
	d, err := m.CreateMIG(ctx, sim.UUID(3), "4g.20gb")
	if err != nil {
		t.Fatal(err)
	}
	if d.GI != 1 || d.Profile != "4g.20gb" || d.GIAccess.Major != h.CapsMajor || len(sim.MIGDevices(3)) != 1 {
		t.Fatalf("created %+v", d)
	}
	for _, c := range []node.DeviceNode{d.GIAccess, d.CIAccess} {
		if num, err := linux.StatDevice(c.Path); err != nil || num.Minor != c.Minor {
			t.Fatalf("%s: %+v, %v", c.Path, num, err)
		}
	}
	if _, err := m.CreateMIG(ctx, sim.UUID(3), "4g.20gb"); !errors.Is(err, node.ErrInsufficient) {
		t.Fatalf("a second 4g.20gb: %v", err)
	}
	if _, err := m.CreateMIG(ctx, sim.UUID(5), "1g.5gb"); !errors.Is(err, simnode.ErrMIGLayout) {
		t.Fatalf("MIG device on a GPU with MIG off: %v", err)
	}
	if err := m.DestroyMIG(ctx, sim.UUID(3), d.UUID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.GIAccess.Path); !errors.Is(err, os.ErrNotExist) || len(sim.MIGDevices(3)) != 0 {
		t.Fatalf("destroyed device left %v, %d devices", err, len(sim.MIGDevices(3)))
	}
	if err := m.DestroyMIG(ctx, sim.UUID(3), d.UUID); !errors.Is(err, simnode.ErrNoSuchMIGDevice) {
		t.Fatalf("second destroy: %v", err)
	}
}

// TestMIGManagerCreateAt creates MIG devices at chosen placements: at the
// start asked for, refused where an instance overlaps it or the profile has
// no such placement, and beside a user's instance that stays as it was.
func TestMIGManagerCreateAt(t *testing.T) {
	ctx := context.Background()
	sim, err := simnode.New("hgx-h100-dynmig")
	if err != nil {
		t.Fatal(err)
	}
	if !sim.MIGEnabled(0) || len(sim.MIGDevices(0)) != 0 || len(sim.MIGDevices(1)) != 1 {
		t.Fatalf("GPU 0: MIG %v with %v; GPU 1: %v", sim.MIGEnabled(0), sim.MIGDevices(0), sim.MIGDevices(1))
	}
	m := sim.MIGManager(nil)
	d, err := m.CreateMIGAt(ctx, sim.UUID(0), "1g.10gb", 3)
	if err != nil {
		t.Fatal(err)
	}
	if d.Placement != (node.MIGPlacement{Start: 3, Size: 1}) || d.GI != 10 || d.Parent != 0 {
		t.Fatalf("created %+v", d)
	}
	if _, err := m.CreateMIGAt(ctx, sim.UUID(0), "2g.20gb", 2); !errors.Is(err, node.ErrInsufficient) {
		t.Fatalf("2g.20gb over the 1g.10gb at 3: %v", err)
	}
	if _, err := m.CreateMIGAt(ctx, sim.UUID(0), "4g.40gb", 4); !errors.Is(err, simnode.ErrMIGLayout) {
		t.Fatalf("4g.40gb at 4, not a placement of the profile: %v", err)
	}
	if _, err := m.CreateMIGAt(ctx, sim.UUID(1), "1g.10gb", 2); !errors.Is(err, node.ErrInsufficient) {
		t.Fatalf("1g.10gb inside the user's 3g.40gb: %v", err)
	}
	user := sim.MIGDevices(1)[0]
	if _, err := m.CreateMIGAt(ctx, sim.UUID(1), "3g.40gb", 4); err != nil {
		t.Fatal(err)
	}
	if got := sim.MIGDevices(1); len(got) != 2 || got[0] != user {
		t.Fatalf("GPU 1 after a 3g.40gb at 4: %+v", got)
	}
	if err := m.DestroyMIG(ctx, sim.UUID(0), d.UUID); err != nil || len(sim.MIGDevices(0)) != 0 {
		t.Fatalf("destroy: %v, left %v", err, sim.MIGDevices(0))
	}
}

// TestRestoreMIG: the MIG devices a MIGManager with a host tree makes and
// destroys are there again for the node made anew over the same tree (a
// restarted program), with the same UUIDs; a tree without a record, or a
// node not told to, keeps the topology's layout; a bad record is refused.
func TestRestoreMIG(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	sim, _ := simnode.New("hgx-h100-dynmig")
	h, err := sim.MakeHost(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Remove()
	again := func() *simnode.Node {
		t.Helper()
		s, _ := simnode.New("hgx-h100-dynmig")
		if err := s.RestoreMIG(h); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := again(); len(s.MIGDevices(0)) != 0 || len(s.MIGDevices(1)) != 1 {
		t.Fatalf("no record: %v %v", s.MIGDevices(0), s.MIGDevices(1))
	}
	d, err := sim.MIGManager(h).CreateMIGAt(ctx, sim.UUID(0), "2g.20gb", 4)
	if err != nil {
		t.Fatal(err)
	}
	s := again()
	if got := s.MIGDevices(0); len(got) != 1 || got[0].UUID != d.UUID || got[0].Start != 4 || got[0].Profile != "2g.20gb" || len(s.MIGDevices(1)) != 1 {
		t.Fatalf("restored %+v, %+v", got, s.MIGDevices(1))
	}
	if fresh, _ := simnode.New("hgx-h100-dynmig"); len(fresh.MIGDevices(0)) != 0 {
		t.Fatal("a node not restored has the made device")
	}
	if err := s.MIGManager(h).DestroyMIG(ctx, s.UUID(0), d.UUID); err != nil {
		t.Fatal(err)
	}
	if got := again().MIGDevices(0); len(got) != 0 {
		t.Fatalf("restored after the destroy: %+v", got)
	}
	if err := os.WriteFile(filepath.Join(h.ProcRoot, "driver", "nvidia", "gpuiso-sim-mig-layout.json"), []byte(`{"gpus":{"3":[]}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	bad, _ := simnode.New("hgx-h100-dynmig")
	if err := bad.RestoreMIG(h); !errors.Is(err, simnode.ErrMIGLayout) {
		t.Fatalf("a record of a GPU without MIG: %v", err)
	}
}
