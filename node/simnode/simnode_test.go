package simnode_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/simnode"
)

func TestShippedTopologies(t *testing.T) {
	want := []string{"dgx-a100", "dgx-a100-mig", "dgx1-pascal", "dgx1-volta", "dgx2", "hgx-h100", "hgx-h100-dynmig", "hgx-h100-mig", "pcie8", "rtx8000x4"}
	if got := simnode.Names(); !slices.Equal(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	for _, name := range want {
		if _, err := simnode.New(name); err != nil {
			t.Errorf("New(%q): %v", name, err)
		}
	}
	_, err := simnode.New("dgx-z9")
	var unknown *simnode.UnknownTopologyError
	if !errors.Is(err, simnode.ErrUnknownTopology) || !errors.As(err, &unknown) || len(unknown.Known) != len(want) {
		t.Fatalf("New(unknown) = %v, want an UnknownTopologyError listing the shipped ones", err)
	}
}

func TestStableIdentity(t *testing.T) {
	a, _ := simnode.New("dgx2")
	b, _ := simnode.New("dgx2")
	c, _ := simnode.New("dgx1-volta")
	uuid := regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for i := range a.Len() {
		if a.UUID(i) != b.UUID(i) {
			t.Fatalf("GPU %d: UUID differs between two nodes of one topology", i)
		}
		if !uuid.MatchString(a.UUID(i)) || seen[a.UUID(i)] {
			t.Fatalf("GPU %d: UUID %q malformed or repeated", i, a.UUID(i))
		}
		seen[a.UUID(i)] = true
	}
	if a.UUID(0) == c.UUID(0) {
		t.Fatal("two topologies share a UUID")
	}
	h, ret := a.NVML().DeviceGetHandleByUUID(a.UUID(5))
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if idx, _ := h.GetIndex(); idx != 5 {
		t.Fatalf("handle by UUID is GPU %d, want 5", idx)
	}
	pci, _ := h.GetPciInfo()
	if h2, ret := a.NVML().DeviceGetHandleByPciBusId(strings.ToLower(a.Spec().GPUs[5].BusID)); ret != nvml.SUCCESS || h2 != h {
		t.Fatalf("handle by bus id %v: %v", pci.BusId, ret)
	}
}

func TestParseSpecRejects(t *testing.T) {
	valid := `{"name":"x","gpu":{"model":"M","brand":"Tesla","architecture":"volta","computeCapability":"7.0","memoryMiB":1},"gpus":[%s]%s}`
	gpu := `{"busId":"0000:06:00.0","numaNode":0,"hostBridge":0}`
	gpu2 := `{"busId":"0000:07:00.0","numaNode":0,"hostBridge":0}`
	tests := map[string]string{
		"unknown field":    `{"name":"x","gpus":[],"colour":"green"}`,
		"no GPUs":          fmt.Sprintf(valid, "", ""),
		"duplicate bus id": fmt.Sprintf(valid, gpu+","+gpu, ""),
		"raw bus id":       fmt.Sprintf(valid, `{"busId":"00000000:06:00.0"}`, ""),
		"self link":        fmt.Sprintf(valid, gpu+","+gpu2, `,"nvlinks":[[1,1,2]]`),
		"link to nowhere":  fmt.Sprintf(valid, gpu+","+gpu2, `,"nvlinks":[[0,2,1]]`),
		"minor taken":      fmt.Sprintf(valid, gpu+`,{"busId":"0000:07:00.0","minor":0}`, ""),
		"not JSON":         `{`,
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := simnode.ParseSpec(strings.NewReader(in)); !errors.Is(err, simnode.ErrInvalidSpec) {
				t.Fatalf("ParseSpec = %v, want ErrInvalidSpec", err)
			}
		})
	}
	if _, err := simnode.ParseSpec(strings.NewReader(fmt.Sprintf(valid, gpu+","+gpu2, `,"nvlinks":[[0,1,4]]`))); err != nil {
		t.Fatalf("valid spec rejected: %v", err)
	}
}

// TestUnsimulatedCalls: what the simulation does not model answers like a
// driver without the feature, not with the mock's panic.
func TestUnsimulatedCalls(t *testing.T) {
	sim, _ := simnode.New("pcie8")
	h, _ := sim.NVML().DeviceGetHandleByIndex(0)
	if _, ret := h.GetTemperature(nvml.TEMPERATURE_GPU); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Fatalf("GetTemperature = %v, want ERROR_NOT_SUPPORTED", ret)
	}
	if _, ret := sim.NVML().GetExcludedDeviceCount(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Fatalf("GetExcludedDeviceCount = %v, want ERROR_NOT_SUPPORTED", ret)
	}
	if _, ret := h.GetNvLinkState(0); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Fatalf("NVLink state on a PCIe-only GPU = %v, want ERROR_NOT_SUPPORTED", ret)
	}
}

func TestEvents(t *testing.T) {
	sim, _ := simnode.New("dgx1-volta")
	lib := sim.NVML()
	set, ret := lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	h2, _ := lib.DeviceGetHandleByIndex(2)
	if ret := h2.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret := h2.RegisterEvents(nvml.EventTypeClock, set); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Fatalf("registering an unsupported event type = %v", ret)
	}

	if _, ret := set.Wait(10); ret != nvml.ERROR_TIMEOUT {
		t.Fatalf("Wait with nothing queued = %v, want ERROR_TIMEOUT", ret)
	}
	if err := sim.InjectXID(3, 48); err != nil { // GPU 3 is not watched
		t.Fatal(err)
	}
	if err := sim.InjectXID(2, 48); err != nil {
		t.Fatal(err)
	}
	e, ret := set.Wait(1000)
	if ret != nvml.SUCCESS || e.Device != h2 || e.EventType != nvml.EventTypeXidCriticalError || e.EventData != 48 {
		t.Fatalf("Wait = %+v, %v; want XID 48 of GPU 2", e, ret)
	}
	if _, ret := set.Wait(10); ret != nvml.ERROR_TIMEOUT {
		t.Fatalf("an event of an unwatched GPU was delivered: %v", ret)
	}

	// A waiter blocked in Wait wakes for an event that comes later.
	got := make(chan uint64)
	go func() {
		e, _ := set.Wait(5000)
		got <- e.EventData
	}()
	if err := sim.Lose(2); err != nil {
		t.Fatal(err)
	}
	if xid := <-got; xid != simnode.XIDFallenOffBus {
		t.Fatalf("losing the GPU delivered XID %d, want %d", xid, simnode.XIDFallenOffBus)
	}
	if _, ret := h2.GetUUID(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Fatalf("GetUUID of a lost GPU = %v", ret)
	}
	h0, _ := lib.DeviceGetHandleByIndex(0)
	if _, ret := h0.GetTopologyCommonAncestor(h2); ret != nvml.ERROR_GPU_IS_LOST {
		t.Fatalf("topology towards a lost GPU = %v", ret)
	}
	if err := sim.Restore(2); err != nil {
		t.Fatal(err)
	}
	if uuid, ret := h2.GetUUID(); ret != nvml.SUCCESS || uuid != sim.UUID(2) {
		t.Fatalf("restored GPU: %q %v", uuid, ret)
	}

	if ret := set.Free(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := set.Wait(10); ret == nvml.SUCCESS || ret == nvml.ERROR_TIMEOUT {
		t.Fatalf("Wait on a freed set = %v", ret)
	}
	for _, err := range []error{sim.InjectXID(8, 1), sim.Lose(-1), sim.Restore(99)} {
		if !errors.Is(err, simnode.ErrNoSuchGPU) {
			t.Errorf("out-of-range GPU: %v, want ErrNoSuchGPU", err)
		}
	}
}

func TestDriverVersion(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "libnvidia-ml.so.535.104.05"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("libnvidia-ml.so.535.104.05", filepath.Join(dir, "libnvidia-ml.so.1")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		opts        []simnode.Option
		driver      string
		cudaVersion int
	}{
		{"from host libraries", []simnode.Option{simnode.WithLibraryDirs(t.TempDir(), dir)}, "535.104.05", 12020},
		{"no host libraries", []simnode.Option{simnode.WithLibraryDirs(t.TempDir())}, simnode.FallbackDriverVersion, 12040},
		{"explicit", []simnode.Option{simnode.WithDriverVersion("570.86.10"), simnode.WithLibraryDirs(dir)}, "570.86.10", 12080},
		{"explicit CUDA", []simnode.Option{simnode.WithDriverVersion("535.1"), simnode.WithCUDAVersion(12050)}, "535.1", 12050},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sim, err := simnode.New("pcie8", tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			v, _ := sim.NVML().SystemGetDriverVersion()
			c, _ := sim.NVML().SystemGetCudaDriverVersion()
			if v != tt.driver || c != tt.cudaVersion {
				t.Fatalf("driver %s CUDA %d, want %s %d", v, c, tt.driver, tt.cudaVersion)
			}
		})
	}
	for _, bad := range []string{"", "535.x", "../535.1", "1.2.3.4.5.6.7.8.9.10.11.12.13.14.15.16.17"} {
		if _, err := simnode.New("pcie8", simnode.WithDriverVersion(bad)); !errors.Is(err, simnode.ErrInvalidVersion) {
			t.Errorf("WithDriverVersion(%q) accepted", bad)
		}
	}
}

func TestMakeHostRefusesRealDev(t *testing.T) {
	sim, _ := simnode.New("pcie8")
	for _, dir := range []string{"/", "/dev", "/dev/shm/gpuiso-sim"} {
		if _, err := sim.MakeHost(dir); !errors.Is(err, simnode.ErrRealDev) {
			t.Errorf("MakeHost(%q) = %v, want ErrRealDev", dir, err)
		}
	}
	if _, err := os.Stat("/dev/shm/gpuiso-sim"); err == nil {
		t.Fatal("MakeHost created a directory under /dev before refusing")
	}
	link := filepath.Join(t.TempDir(), "sneaky")
	if err := os.Symlink("/dev/shm", link); err != nil {
		t.Fatal(err)
	}
	if _, err := sim.MakeHost(filepath.Join(link, "sim")); !errors.Is(err, simnode.ErrRealDev) {
		t.Errorf("MakeHost through a symlink into /dev = %v, want ErrRealDev", err)
	}
}

func TestMakeHost(t *testing.T) {
	testenv.RequireRoot(t)
	sim, _ := simnode.New("dgx1-volta")
	dir := t.TempDir()
	h, err := sim.MakeHost(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]linux.DeviceNumber{
		"nvidiactl":        {Char: true, Major: h.NVIDIAMajor, Minor: 255},
		"nvidia-uvm":       {Char: true, Major: h.UVMMajor, Minor: 0},
		"nvidia-uvm-tools": {Char: true, Major: h.UVMMajor, Minor: 1},
	}
	for i := range sim.Len() {
		want[fmt.Sprintf("nvidia%d", sim.Minor(i))] = linux.DeviceNumber{Char: true, Major: h.NVIDIAMajor, Minor: uint32(sim.Minor(i))}
	}
	entries, _ := os.ReadDir(h.DevRoot)
	if len(entries) != len(want) {
		t.Fatalf("dev root holds %d entries, want %d", len(entries), len(want))
	}
	for name, num := range want {
		got, err := linux.StatDevice(filepath.Join(h.DevRoot, name))
		if err != nil || got != num {
			t.Errorf("%s = %+v, %v; want %+v", name, got, err, num)
		}
	}
	majors, err := node.ReadProcDevices(h.ProcRoot)
	if err != nil || majors[node.NVIDIAUVM] != h.UVMMajor {
		t.Fatalf("simulated /proc/devices gives nvidia-uvm %d (%v), want %d", majors[node.NVIDIAUVM], err, h.UVMMajor)
	}
	host, _ := node.ReadProcDevices(node.DefaultProcRoot)
	for name, m := range host {
		if m == h.UVMMajor {
			t.Fatalf("UVM major %d is the real host's %s", m, name)
		}
	}
	if _, err := sim.MakeHost(dir); !errors.Is(err, os.ErrExist) {
		t.Fatalf("second MakeHost in one directory = %v, want ErrExist", err)
	}
	if err := h.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(h.DevRoot); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("Remove left the dev root")
	}
}

// TestMakeHostUnprivileged: without root the device nodes cannot be made,
// and nothing is left behind.
func TestMakeHostUnprivileged(t *testing.T) {
	if linux.IsRoot() {
		t.Skip("runs only without root (mknod succeeds as root)")
	}
	sim, _ := simnode.New("pcie8")
	dir := t.TempDir()
	if _, err := sim.MakeHost(dir); !errors.Is(err, os.ErrPermission) {
		t.Fatalf("MakeHost without root = %v, want a permission error", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("MakeHost left %v behind", entries)
	}
}
