package native

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/linux"
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
	if spec.RootFS != "" {
		if !filepath.IsAbs(spec.RootFS) {
			return cf, fmt.Errorf("%w: root file system %q is not absolute", containerizer.ErrInvalidSpec, spec.RootFS)
		}
		fi, err := os.Stat(spec.RootFS)
		if err != nil || !fi.IsDir() {
			return cf, fmt.Errorf("%w: root file system %q is not a directory", containerizer.ErrInvalidSpec, spec.RootFS)
		}
		cf.RootFS = filepath.Clean(spec.RootFS)
	}
	return cf, nil
}

// capNames names the capability numbers caps.
func capNames(caps []int) []string {
	out := make([]string, 0, len(caps))
	for _, c := range caps {
		out = append(out, linux.CapabilityName(c))
	}
	return out
}
