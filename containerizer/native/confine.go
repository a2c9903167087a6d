package native

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/isolator/mps"
)

// DefaultCapabilities are the capabilities a container's command gets when
// it runs as root: Docker's default set.
func DefaultCapabilities() []string {
	return []string{
		"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
		"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
		"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
	}
}

// maskedPaths are hidden from a container (an empty directory or an empty
// file), as Docker hides them.
func maskedPaths() []string {
	return []string{
		"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
		"/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
	}
}

// readOnlyPaths are read-only in a container, as in Docker's.
func readOnlyPaths() []string {
	return []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
}

// confinement is what the init applies before it starts the command, sent
// in its config.
type confinement struct {
	// RootFS is the container's own root file system; "" keeps the host's.
	RootFS string `json:"rootfs,omitempty"`
	// HostRoot, for a container that keeps the host's file system, is an
	// empty directory where the init binds the host's root read-only
	// (with a private /tmp and, when set, its working directory writable)
	// and pivots into it.
	HostRoot string `json:"hostRoot,omitempty"`
	// Caps are the capability numbers the command keeps.
	Caps []int `json:"caps"`
	// User, when set, is who the command runs as.
	User *containerizer.User `json:"user,omitempty"`
	// HostNetwork keeps the host's network namespace; otherwise the init
	// was born in a new one, where it brings the loopback interface up.
	HostNetwork bool `json:"hostNetwork,omitempty"`
	// Hostname names the container's UTS namespace.
	Hostname string `json:"hostname,omitempty"`
	// Seccomp is Docker's default profile for Caps, as the BPF program the
	// init loads on the thread that starts the command.
	Seccomp []linux.SeccompInstruction `json:"seccomp,omitempty"`
}

// shmBytes bounds a container's own /dev/shm (a tmpfs, nosuid, nodev,
// noexec): 64 MiB, Docker's default, and what a memory share's /dev/shm
// holds (mps.DefaultShmBytes). Its pages count in the container's memory
// cgroup.
const shmBytes = 64 << 20

// privateDirs are the host's directories a container that keeps the host's
// file system gets a private, empty, writable tmpfs over (nosuid, nodev):
// /tmp and /var/tmp, shared by every user of the host, and /run (and
// /var/run where it is not a link to it), where the host's daemons keep
// their control sockets: Docker's, containerd's, Podman's, systemd's. A
// read-only mount does not stop connect(2) on a socket, so the sockets must
// not be there at all.
func privateDirs() []string { return []string{"/tmp", "/var/tmp", "/run", "/var/run"} }

// engineDirs are the state directories of the host's container engines,
// hidden (an empty read-only tmpfs) from a container that keeps the host's
// file system: they hold other containers' files and the engines' sockets
// (the kubelet's device-plugin and pod-resources sockets among them).
func engineDirs() []string {
	return []string{
		"/var/lib/docker", "/var/lib/containerd", "/var/lib/containers",
		"/var/lib/kubelet", "/var/lib/crio", "/var/lib/lxd", "/var/lib/incus",
	}
}

// GPUISOStateDirs are the default state directories of gpuiso's programs
// (gpurun, the agent, the kubelet plugin, gpuiso-runtime's index, the
// native and Docker containerizers, the volume manager): masked, with
// every directory the MPS registry records, in a container that keeps the
// host's file system. Those under /run and /var/run are behind the
// container's private tmpfs already; they are listed for a host whose /run
// is elsewhere.
func GPUISOStateDirs() []string {
	return []string{
		"/var/lib/gpuiso", "/var/lib/gpuiso-kubelet-plugin",
		"/run/gpuiso", "/var/run/gpuiso", "/run/gpuiso-runtime", "/var/run/gpuiso-runtime",
	}
}

// hiddenDirs are the directories a container that keeps the host's file
// system has masked beyond the engines' (engineDirs): own (its own MPS
// manager's directory, when set), gpuiso's default state directories and
// the registered MPS directories, sorted, each once. A directory that would
// hide the whole host, or a path the container needs of its own (/dev,
// /proc, /sys, /tmp), is left out: the registry is root's, but a careless
// manager directory must not blind every container.
func hiddenDirs(own string, registered []string) []string {
	var out []string
	for _, d := range slices.Concat([]string{own}, GPUISOStateDirs(), registered) {
		if d == "" || !filepath.IsAbs(d) {
			continue
		}
		d = filepath.Clean(d)
		if slices.ContainsFunc([]string{"/dev", "/proc", "/sys", "/tmp"}, func(p string) bool {
			return p == d || strings.HasPrefix(p, d+"/") || d == "/"
		}) {
			continue
		}
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return out
}

// hidden is hiddenDirs of the registry as it is now; a registry that does
// not read whole is reported and what it gave is used.
func (r *runner) hidden(own string) []string {
	reg, err := mps.Registered(r.cfg.MPSRegistry)
	if err != nil {
		r.cfg.Logger.Warn("mps registry", "err", err)
	}
	return hiddenDirs(own, reg)
}

// confinementOf checks spec's confinement fields and turns them into what
// the init applies. Bad input gives an error matching
// containerizer.ErrInvalidSpec.
func confinementOf(spec containerizer.Spec) (confinement, error) {
	var cf confinement
	names := slices.Concat(DefaultCapabilities(), spec.CapAdd)
	for _, name := range names {
		n, err := linux.Capability(name)
		if err != nil {
			return cf, fmt.Errorf("%w: %w", containerizer.ErrInvalidSpec, err)
		}
		if !slices.Contains(cf.Caps, n) {
			cf.Caps = append(cf.Caps, n)
		}
	}
	slices.Sort(cf.Caps)
	if spec.User != nil {
		u := *spec.User
		cf.User = &u
	}
	network, err := containerizer.ParseNetwork(string(spec.Network))
	if err != nil {
		return cf, err
	}
	cf.HostNetwork = network == containerizer.NetworkHost
	if spec.RootFS != "" {
		if !filepath.IsAbs(spec.RootFS) {
			return cf, fmt.Errorf("%w: root file system %q is not absolute", containerizer.ErrInvalidSpec, spec.RootFS)
		}
		fi, err := os.Stat(spec.RootFS)
		if err != nil || !fi.IsDir() {
			return cf, fmt.Errorf("%w: root file system %q is not a directory", containerizer.ErrInvalidSpec, spec.RootFS)
		}
		real, err := filepath.EvalSymlinks(spec.RootFS)
		if err != nil {
			return cf, fmt.Errorf("%w: root file system %q: %w", containerizer.ErrInvalidSpec, spec.RootFS, err)
		}
		if real == "/" {
			return cf, fmt.Errorf("%w: root file system %q is the host's root: a container keeps the host's file system read-only without one", containerizer.ErrInvalidSpec, spec.RootFS)
		}
		cf.RootFS = filepath.Clean(spec.RootFS)
	}
	return cf, nil
}

// checkRootFS refuses a root file system that holds the containerizer's
// state directory: the container could rewrite every container's record.
func checkRootFS(rootfs, stateDir string) error {
	if rootfs == "" {
		return nil
	}
	root, err := filepath.EvalSymlinks(rootfs)
	if err != nil {
		return fmt.Errorf("%w: root file system %q: %w", containerizer.ErrInvalidSpec, rootfs, err)
	}
	state, err := filepath.EvalSymlinks(stateDir)
	if err != nil {
		state = filepath.Clean(stateDir)
	}
	if rel, err := filepath.Rel(root, state); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
		return fmt.Errorf("%w: root file system %q holds the state directory %s", containerizer.ErrInvalidSpec, rootfs, stateDir)
	}
	return nil
}

// hostname is what a container's UTS namespace is called: its id, cut to
// what the kernel takes.
func hostname(id string) string {
	if len(id) > 63 {
		return id[:63]
	}
	return id
}

// capNames names the capability numbers caps.
func capNames(caps []int) []string {
	out := make([]string, 0, len(caps))
	for _, c := range caps {
		out = append(out, linux.CapabilityName(c))
	}
	return out
}
