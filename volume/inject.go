package volume

import (
	"slices"
	"strings"
)

// Where the volume appears in a container, and what the container's
// environment gains.
const (
	ContainerPath  = "/usr/local/nvidia"
	ContainerBin   = ContainerPath + "/bin"
	ContainerLib   = ContainerPath + "/lib"
	ContainerLib64 = ContainerPath + "/lib64"
	// CUDACompat holds CUDA's forward-compatibility libraries in images that
	// ship them; they come before the driver's only when [DecideCompat]
	// says so.
	CUDACompat = "/usr/local/cuda/compat"
	// DefaultPath is the PATH of an image that sets none.
	DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// Labels and environment variables of an image that concern the volume.
const (
	LabelVolumesNeeded = "com.nvidia.volumes.needed"
	LabelCUDAVersion   = "com.nvidia.cuda.version"
	EnvVisibleDevices  = "NVIDIA_VISIBLE_DEVICES"
	EnvDisableRequire  = "NVIDIA_DISABLE_REQUIRE"
	EnvRequirePrefix   = "NVIDIA_REQUIRE_"
	EnvRequireCUDA     = "NVIDIA_REQUIRE_CUDA"
	EnvCUDAVersion     = "CUDA_VERSION"
	// envRequireJetpack prefixes Jetson requirements, which the runtime
	// ignores on other hosts.
	envRequireJetpack = "NVIDIA_REQUIRE_JETPACK"
)

// Image is what an image (or a container's configuration) says about itself.
type Image struct {
	// Labels are the image's labels.
	Labels map[string]string
	// Env is the environment, "KEY=value" each, later entries winning.
	Env []string
}

// Getenv returns the value of the last entry of Env named key.
func (img Image) Getenv(key string) (string, bool) {
	for i := len(img.Env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(img.Env[i], "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// NeedsVolume reports whether a container of img gets the driver volume:
// the image carries the com.nvidia.volumes.needed label, or sets
// NVIDIA_VISIBLE_DEVICES to something other than "" or "void".
func (img Image) NeedsVolume() bool {
	if _, ok := img.Labels[LabelVolumesNeeded]; ok {
		return true
	}
	v, ok := img.Getenv(EnvVisibleDevices)
	v = strings.TrimSpace(v)
	return ok && v != "" && v != "void"
}

// Mount is a bind mount of the volume, as plain data for the isolators.
type Mount struct {
	Source      string   `json:"source"`
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Options     []string `json:"options"`
}

// Injection is what a container gets of a volume.
type Injection struct {
	// Mount puts the volume read-only at ContainerPath.
	Mount Mount `json:"mount"`
	// Env holds the PATH and LD_LIBRARY_PATH the container must have, as
	// "KEY=value", to be set over the image's.
	Env []string `json:"env"`
}

// Injection returns the mount of v and the environment a container with
// the environment env must get: PATH gains ContainerBin at its end;
// LD_LIBRARY_PATH gains ContainerLib and ContainerLib64 last. Entries
// already present keep their place. CUDACompat is not added, and is taken
// out of the image's LD_LIBRARY_PATH: a caller that can read the image's
// files uses [Volume.InjectionCompat].
func (v *Volume) Injection(env []string) Injection {
	return v.InjectionCompat(env, Compat{})
}

// InjectionCompat is [Volume.Injection] with the forward-compatibility
// decision c (from [DecideCompat] or [CompatFor]): when c.Use is true,
// LD_LIBRARY_PATH gains CUDACompat first; otherwise CUDACompat is taken out
// of it.
func (v *Volume) InjectionCompat(env []string, c Compat) Injection {
	img := Image{Env: env}
	path, ok := img.Getenv("PATH")
	if !ok {
		path = DefaultPath
	}
	ld, _ := img.Getenv("LD_LIBRARY_PATH")
	var first []string
	mid := splitPath(ld)
	if c.Use {
		first = []string{CUDACompat}
	} else {
		mid = slices.DeleteFunc(mid, func(d string) bool { return strings.TrimRight(d, "/") == CUDACompat })
	}
	return Injection{
		Mount: Mount{
			Source:      v.Path,
			Destination: ContainerPath,
			Type:        "bind",
			Options:     []string{"rbind", "ro", "nosuid", "nodev"},
		},
		Env: []string{
			"PATH=" + joinPath(nil, splitPath(path), []string{ContainerBin}),
			"LD_LIBRARY_PATH=" + joinPath(first, mid, []string{ContainerLib, ContainerLib64}),
		},
	}
}

func splitPath(s string) []string {
	return slices.DeleteFunc(strings.Split(s, ":"), func(e string) bool { return e == "" })
}

// joinPath joins first, then mid, then last, each directory once.
func joinPath(first, mid, last []string) string {
	var out []string
	for _, part := range [][]string{first, mid, last} {
		for _, d := range part {
			if !slices.Contains(out, d) {
				out = append(out, d)
			}
		}
	}
	return strings.Join(out, ":")
}
