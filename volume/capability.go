package volume

import (
	"fmt"
	"slices"
	"strings"
)

// Capability is a part of the driver a container may need, as
// NVIDIA_DRIVER_CAPABILITIES names it.
type Capability string

// The capabilities. Display adds nothing to the volume: it needs the
// /dev/nvidia-modeset node, which the isolators hand out.
const (
	Utility  Capability = "utility"
	Compute  Capability = "compute"
	Video    Capability = "video"
	Graphics Capability = "graphics"
	Display  Capability = "display"
	Compat32 Capability = "compat32"
)

// AllCapabilities returns every capability, the default of a Manager.
func AllCapabilities() []Capability {
	return []Capability{Utility, Compute, Video, Graphics, Display, Compat32}
}

// ParseCapabilities reads a comma-separated list such as
// "utility,compute", or "all". Video brings compute with it.
func ParseCapabilities(s string) ([]Capability, error) {
	if strings.TrimSpace(s) == "all" {
		return AllCapabilities(), nil
	}
	var caps []Capability
	for f := range strings.SplitSeq(s, ",") {
		c := Capability(strings.TrimSpace(f))
		if !slices.Contains(AllCapabilities(), c) {
			return nil, fmt.Errorf("capability %q: %w", c, ErrInvalidName)
		}
		caps = append(caps, c)
	}
	return normalizeCapabilities(caps), nil
}

// normalizeCapabilities adds compute to video, sorts and removes duplicates.
func normalizeCapabilities(caps []Capability) []Capability {
	caps = slices.Clone(caps)
	if slices.Contains(caps, Video) {
		caps = append(caps, Compute)
	}
	slices.Sort(caps)
	return slices.Compact(caps)
}

// binaries are the driver's programs by capability.
func binaries(c Capability) []string {
	switch c {
	case Utility:
		return []string{"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"}
	case Compute:
		return []string{"nvidia-cuda-mps-control", "nvidia-cuda-mps-server"}
	}
	return nil
}

// libraries are the driver's libraries by capability, by the name before
// ".so".
func libraries(c Capability) []string {
	switch c {
	case Utility:
		return []string{"libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq"}
	case Compute:
		return []string{"libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-gpucomp",
			"libnvidia-ptxjitcompiler", "libnvidia-fatbinaryloader", "libnvidia-allocator",
			"libnvidia-compiler", "libnvidia-pkcs11", "libnvidia-pkcs11-openssl3", "libnvidia-nvvm"}
	case Video:
		return []string{"libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid"}
	case Graphics:
		return []string{"libnvidia-eglcore", "libnvidia-glcore", "libnvidia-tls", "libnvidia-glsi",
			"libnvidia-fbc", "libnvidia-ifr", "libnvidia-rtcore", "libnvoptix", "libGLX_nvidia",
			"libEGL_nvidia", "libGLESv2_nvidia", "libGLESv1_CM_nvidia", "libnvidia-glvkspirv",
			"libnvidia-cbl"}
	}
	return nil
}

// genericGL are the vendor-neutral GL libraries, taken for graphics only when
// the file needs NVIDIA's GL core or GLVND's dispatcher (never Mesa's).
func genericGL() []string { return []string{"libGL", "libEGL", "libGLESv1_CM", "libGLESv2"} }

// genericGLNeeds are the DT_NEEDED prefixes that mark a generic GL library
// as one to take.
func genericGLNeeds() []string { return []string{"libnvidia-glcore.so", "libGLdispatch.so"} }
