// Package testenv holds the Require helpers that gate gpuiso's privileged and
// hardware test suites.
//
// Each helper skips the calling test with a reason when the host cannot run the
// suite (not root, no cgroup v2, no Docker daemon, ...). A suite named in the
// GPUISO_REQUIRE environment variable (a comma-separated list of suite names,
// or "all") is required: a skip of it fails the test instead, so that the
// project's full test command cannot pass while silently skipping what it was
// meant to prove.
package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// RequireEnv names the environment variable listing the required suites.
const RequireEnv = "GPUISO_REQUIRE"

// Suite names a group of tests that need something of the host.
type Suite string

// The suites. "all" in RequireEnv requires every one of them except GPU,
// which needs hardware that test hosts do not have.
const (
	Root            Suite = "root"            // run as root
	CgroupV1Devices Suite = "cgroup1-devices" // the cgroup v1 devices controller
	CgroupV2        Suite = "cgroup2"         // a writable cgroup2 hierarchy with eBPF device programs
	Docker          Suite = "docker"          // a Docker daemon that answers
	NVIDIALibraries Suite = "nvidia-libs"     // the NVIDIA user-space driver (libnvidia-ml.so.1)
	Podman          Suite = "podman"          // rootful Podman, a CDI runtime
	Runc            Suite = "runc"            // a runc binary on PATH (the OCI runtime gpuiso-runtime hands bundles to)
	CurrentDocker   Suite = "current-docker"  // a current Docker daemon (API 1.44+) built by .ci/current-docker.sh
	Kubernetes      Suite = "kubernetes"      // a one-node Kubernetes cluster from the pinned build of .ci/k8s-build.sh
	Helm            Suite = "helm"            // the pinned helm of .ci/helm-build.sh (the chart's render and lint checks)
	CgroupV2VM      Suite = "cgroup2-vm"      // the cgroup2-only VM of internal/testing/vmtest: qemu and the kernel .ci/vm-kernel.sh caches
	GPU             Suite = "gpu"             // a real NVIDIA GPU with a loaded kernel driver
	NUMA            Suite = "numa"            // a host with two NUMA nodes or more (the cgroup2-only VM has two)
)

// Suites lists every suite that "all" stands for. On a cgroup2-only host
// (no v1 hierarchy can exist there) it leaves out the cgroup v1 devices
// suite; the cgroup2-only VM suite, which proves that host's case on a
// hybrid one, then skips by itself.
func Suites() []Suite {
	all := []Suite{Root, CgroupV1Devices, CgroupV2, Docker, NVIDIALibraries, Podman, Runc, CurrentDocker, Kubernetes, Helm, CgroupV2VM}
	if CgroupV2Only() {
		all = slices.DeleteFunc(all, func(s Suite) bool { return s == CgroupV1Devices })
	}
	return all
}

// Required reports whether suite is listed in RequireEnv.
func Required(suite Suite) bool {
	for _, s := range strings.Split(os.Getenv(RequireEnv), ",") {
		s = strings.TrimSpace(s)
		if s == string(suite) || (s == "all" && slices.Contains(Suites(), suite)) {
			return true
		}
	}
	return false
}

// CgroupV2Only reports whether the host mounts the unified hierarchy alone
// (cgroup2 at /sys/fs/cgroup), as systemd hosts in unified mode do.
func CgroupV2Only() bool {
	magic, err := linux.FilesystemType(cgroupRoot)
	return err == nil && magic == linux.Cgroup2Magic
}

// skip skips tb, or fails it when the suite is required.
func skip(tb testing.TB, suite Suite, format string, args ...any) {
	tb.Helper()
	reason := fmt.Sprintf(format, args...)
	if Required(suite) {
		tb.Fatalf("required suite %q cannot run: %s (%s=%q)", suite, reason, RequireEnv, os.Getenv(RequireEnv))
	}
	tb.Skipf("suite %q skipped: %s", suite, reason)
}

// RequireRoot skips tb unless the process runs as root.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if !linux.IsRoot() {
		skip(tb, Root, "needs root (effective uid %d)", os.Geteuid())
	}
}

// Cgroup mount points of the hosts gpuiso supports.
const (
	cgroupV1Devices = "/sys/fs/cgroup/devices"
	cgroupUnified   = "/sys/fs/cgroup/unified" // cgroup2 in hybrid mode
	cgroupRoot      = "/sys/fs/cgroup"         // cgroup2 in unified mode
)

// RequireCgroupV1Devices skips tb unless the process is root and the cgroup v1
// devices controller is mounted. It returns the controller's mount point.
func RequireCgroupV1Devices(tb testing.TB) string {
	tb.Helper()
	if !linux.IsRoot() {
		skip(tb, CgroupV1Devices, "needs root to write device rules")
	}
	magic, err := linux.FilesystemType(cgroupV1Devices)
	if err != nil || magic != linux.CgroupMagic {
		skip(tb, CgroupV1Devices, "no cgroup v1 devices controller at %s", cgroupV1Devices)
	}
	if _, err := os.Stat(filepath.Join(cgroupV1Devices, "devices.allow")); err != nil {
		skip(tb, CgroupV1Devices, "%s has no devices.allow: %v", cgroupV1Devices, err)
	}
	return cgroupV1Devices
}

// RequireCgroupV2 skips tb unless the process is root and a cgroup2 hierarchy is
// mounted (at /sys/fs/cgroup in unified mode, /sys/fs/cgroup/unified in hybrid
// mode). It returns the mount point.
func RequireCgroupV2(tb testing.TB) string {
	tb.Helper()
	if !linux.IsRoot() {
		skip(tb, CgroupV2, "needs root to create cgroups and attach device programs")
	}
	for _, p := range []string{cgroupRoot, cgroupUnified} {
		if magic, err := linux.FilesystemType(p); err == nil && magic == linux.Cgroup2Magic {
			return p
		}
	}
	skip(tb, CgroupV2, "no cgroup2 hierarchy at %s or %s", cgroupRoot, cgroupUnified)
	return ""
}

// RequireDeviceCgroup skips tb unless the process is root and the device
// cgroup a runtime picks by default on this host is there: cgroup2 on a
// cgroup2-only host, v1's devices controller on a hybrid or legacy one. It
// returns it as gpurun's --cgroup names it ("v2" or "v1") and the mount
// point of its hierarchy.
func RequireDeviceCgroup(tb testing.TB) (version, mount string) {
	tb.Helper()
	if CgroupV2Only() {
		return "v2", RequireCgroupV2(tb)
	}
	return "v1", RequireCgroupV1Devices(tb)
}

// CgroupVersions requires every device cgroup this host can have and
// returns them as gpurun's --cgroup names: "v1" and "v2" on a hybrid host,
// "v2" alone on a cgroup2-only one (where no v1 hierarchy can exist).
func CgroupVersions(tb testing.TB) []string {
	tb.Helper()
	if CgroupV2Only() {
		RequireCgroupV2(tb)
		return []string{"v2"}
	}
	RequireCgroupV1Devices(tb)
	RequireCgroupV2(tb)
	return []string{"v1", "v2"}
}

// RequireCgroupV2VM skips tb unless the cgroup2-only VM suite can run:
// root, and nothing it needs missing (missing lists what is, each with its
// reason: package vmtest finds qemu and the cached kernel). On a
// cgroup2-only host it always skips, required or not: the suites the VM
// would run there run natively.
func RequireCgroupV2VM(tb testing.TB, missing ...string) {
	tb.Helper()
	if CgroupV2Only() {
		tb.Skipf("suite %q skipped: this host is cgroup2-only, where the suites run natively", CgroupV2VM)
	}
	if !linux.IsRoot() {
		skip(tb, CgroupV2VM, "the VM's suites run as root (effective uid %d)", os.Geteuid())
	}
	if len(missing) > 0 {
		skip(tb, CgroupV2VM, "missing (bash .ci/provision.sh installs qemu and fetches the kernel): %s", strings.Join(missing, "; "))
	}
}

// RequireNUMA skips tb unless the host has at least two NUMA nodes (node0
// and node1 under sysRoot's devices/system/node; sysRoot "" is /sys). It
// returns the NUMA nodes' CPU lists by node number.
func RequireNUMA(tb testing.TB, sysRoot string) map[int]string {
	tb.Helper()
	if sysRoot == "" {
		sysRoot = "/sys"
	}
	dir := filepath.Join(sysRoot, "devices", "system", "node")
	entries, _ := os.ReadDir(dir)
	cpus := map[int]string{}
	for _, e := range entries {
		var n int
		if _, err := fmt.Sscanf(e.Name(), "node%d", &n); err != nil || e.Name() != fmt.Sprintf("node%d", n) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "cpulist"))
		if err != nil {
			continue
		}
		cpus[n] = strings.TrimSpace(string(b))
	}
	if len(cpus) < 2 {
		skip(tb, NUMA, "%d NUMA node(s) in %s; the pinning tests need two (the cgroup2-only VM has two)", len(cpus), dir)
	}
	return cpus
}

// RequireDocker skips tb unless a Docker daemon answers a ping through the
// environment's settings (DOCKER_HOST, ...). It returns a client whose API
// version is negotiated with the daemon; the client is closed when tb ends.
func RequireDocker(tb testing.TB) *client.Client {
	tb.Helper()
	cli, err := client.New(client.FromEnv)
	if err != nil {
		skip(tb, Docker, "docker client: %v", err)
	}
	tb.Cleanup(func() { cli.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		skip(tb, Docker, "no Docker daemon answers: %v", err)
	}
	return cli
}

// RequireNVIDIALibraries skips tb unless libnvidia-ml.so.1 is installed. It
// returns the library's path.
func RequireNVIDIALibraries(tb testing.TB) string {
	tb.Helper()
	for _, dir := range simnode.DefaultLibraryDirs() {
		p := filepath.Join(dir, "libnvidia-ml.so.1")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	skip(tb, NVIDIALibraries, "libnvidia-ml.so.1 not found in %s", strings.Join(simnode.DefaultLibraryDirs(), ", "))
	return ""
}

// RequireGPU skips tb unless a real GPU is usable: the NVIDIA kernel driver
// is loaded (/proc/driver/nvidia/version exists) and its control node
// /dev/nvidiactl is present.
func RequireGPU(tb testing.TB) {
	tb.Helper()
	RequireNVIDIALibraries(tb)
	if _, err := os.Stat("/proc/driver/nvidia/version"); err != nil {
		skip(tb, GPU, "NVIDIA kernel driver not loaded: %v", err)
	}
	if _, err := os.Stat("/dev/nvidiactl"); err != nil {
		skip(tb, GPU, "no /dev/nvidiactl: %v", err)
	}
}

// RequireRunc skips tb unless a runc binary on PATH answers "runc
// --version". It returns the binary's path.
func RequireRunc(tb testing.TB) string {
	tb.Helper()
	path, err := exec.LookPath("runc")
	if err != nil {
		skip(tb, Runc, "no runc on PATH (bash .ci/provision.sh installs it): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, path, "--version").CombinedOutput(); err != nil {
		skip(tb, Runc, "%s --version: %v: %s", path, err, strings.TrimSpace(string(out)))
	}
	return path
}

// CurrentDockerEnv names the directory holding a current Docker daemon and
// what it runs (dockerd, containerd, containerd-shim-runc-v2, runc), as
// .ci/current-docker.sh builds them; the default is /var/cache/gpuiso/bin.
const CurrentDockerEnv = "GPUISO_DOCKERD_BIN_DIR"

// RequireCurrentDocker skips tb unless a current Docker daemon was built,
// and returns the directory of its binaries.
func RequireCurrentDocker(tb testing.TB) string {
	tb.Helper()
	RequireRoot(tb)
	dir := os.Getenv(CurrentDockerEnv)
	if dir == "" {
		dir = "/var/cache/gpuiso/bin"
	}
	for _, b := range []string{"dockerd", "containerd", "containerd-shim-runc-v2", "runc"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			skip(tb, CurrentDocker, "no current Docker daemon built in %s (bash .ci/current-docker.sh builds one): %v", dir, err)
		}
	}
	return dir
}

// RequireKubernetes skips tb unless the process is root and nothing that a
// one-node Kubernetes cluster needs is missing: missing lists what is (the
// kubernetes module's cluster harness finds it), each with its reason.
func RequireKubernetes(tb testing.TB, missing ...string) {
	tb.Helper()
	if !linux.IsRoot() {
		skip(tb, Kubernetes, "a cluster needs root (effective uid %d)", os.Geteuid())
	}
	if len(missing) > 0 {
		skip(tb, Kubernetes, "missing (bash .ci/k8s-build.sh and .ci/current-docker.sh build them): %s", strings.Join(missing, "; "))
	}
}
