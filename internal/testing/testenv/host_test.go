package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// These tests prove that the test host can enforce device rules at all, with
// the same kernel interfaces the isolators use: a child process in a device
// cgroup opens nodes carrying NVIDIA's numbers. ENXIO (no such device) means
// the cgroup let the open through to a driver that is not there; EPERM means
// the cgroup denied it.

func TestMain(m *testing.M) {
	if os.Getenv(leakyEnv) != "" {
		os.Exit(leakyMain(m))
	}
	MainCheckingLeaks(m)
}

// openIn starts a prober, lets enter move it into a cgroup, and returns what
// each open gave.
func openIn(t *testing.T, enter func(pid int) error, paths ...string) map[string]string {
	t.Helper()
	got, err := StartProber(t, enter).OpenAll(paths...)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// gpuNodes makes /dev/nvidia<minor> look-alikes in a temporary directory.
func gpuNodes(t *testing.T, minors ...uint32) []string {
	t.Helper()
	dir := t.TempDir()
	var paths []string
	for _, m := range minors {
		p := filepath.Join(dir, fmt.Sprintf("nvidia%d", m))
		if err := linux.Mknod(p, 0o666, linux.DeviceNumber{Char: true, Major: 195, Minor: m}); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	return paths
}

func i64(v int64) *int64 { return &v }

// rules denies everything, then allows exactly one GPU minor.
func rules(allowedMinor int64) []specs.LinuxDeviceCgroup {
	return []specs.LinuxDeviceCgroup{
		{Allow: false, Type: "a", Major: i64(-1), Minor: i64(-1), Access: "rwm"},
		{Allow: true, Type: "c", Major: i64(195), Minor: i64(allowedMinor), Access: "rwm"},
	}
}

func TestHostCgroupV1DevicesEnforce(t *testing.T) {
	RequireCgroupV1Devices(t)
	nodes := gpuNodes(t, 7, 9)
	group := fmt.Sprintf("/gpuiso-testenv-%d", os.Getpid())
	cg, err := cgroup1.New(cgroup1.StaticPath(group), &specs.LinuxResources{Devices: rules(7)},
		cgroup1.WithHierarchy(cgroup1.SingleSubsystem(cgroup1.Default, cgroup1.Devices)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cg.Delete() }) // after the prober is gone
	got := openIn(t, func(pid int) error { return cg.Add(cgroup1.Process{Pid: pid}) }, nodes...)
	if !Allowed(got[nodes[0]]) || got[nodes[1]] != "EPERM" {
		t.Fatalf("opens in v1 devices cgroup = %v, want %s allowed and %s EPERM", got, nodes[0], nodes[1])
	}
}

func TestHostCgroupV2DevicesEnforce(t *testing.T) {
	mount := RequireCgroupV2(t)
	nodes := gpuNodes(t, 7, 9)
	group := fmt.Sprintf("/gpuiso-testenv-%d", os.Getpid())
	m, err := cgroup2.NewManager(mount, group, &cgroup2.Resources{Devices: rules(7)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Delete() }) // after the prober is gone
	got := openIn(t, func(pid int) error { return m.AddProc(uint64(pid)) }, nodes...)
	if !Allowed(got[nodes[0]]) || got[nodes[1]] != "EPERM" {
		t.Fatalf("opens in cgroup2 with device program = %v, want %s allowed and %s EPERM", got, nodes[0], nodes[1])
	}
}

func TestHostNVIDIALibraries(t *testing.T) {
	lib := RequireNVIDIALibraries(t)
	real, err := filepath.EvalSymlinks(lib)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(filepath.Base(real), "libnvidia-ml.so.") {
		t.Fatalf("%s resolves to %s, not a versioned libnvidia-ml", lib, real)
	}
}
