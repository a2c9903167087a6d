package node

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// NVIDIACapsDir is the directory under the dev root that holds the MIG
// capability nodes, nvidia-cap<minor>.
const NVIDIACapsDir = "nvidia-caps"

// NVIDIACaps is the /proc/devices name of the driver that owns the MIG
// capability nodes.
const NVIDIACaps = "nvidia-caps"

// MIGProfile is one GPU-instance profile of a MIG-capable GPU, as NVML
// reports it whether or not MIG is enabled: what an instance of that profile
// gets, how many fit on the GPU, and where they may be placed.
type MIGProfile struct {
	// Name is the profile's name as nvidia-smi writes it: "1g.10gb",
	// "1g.10gb+me", "7g.80gb".
	Name string `json:"name"`
	// ID is NVML's profile id (nvidia-smi's "ID" column): 19 for 1g.10gb.
	ID int `json:"id"`
	// Count is how many instances of the profile the GPU holds at most.
	Count int `json:"count"`
	// Slices is the number of compute slices (the "g" of the name).
	Slices int `json:"slices"`
	// SMs is the number of streaming multiprocessors of an instance.
	SMs int `json:"sms"`
	// MemoryBytes is an instance's memory.
	MemoryBytes uint64 `json:"memoryBytes"`
	// Placements are the positions an instance may take, in the GPU's
	// memory slices (eight on A100 and H100).
	Placements []MIGPlacement `json:"placements,omitempty"`
}

// MIGPlacement is a GPU instance's position on its GPU: Size memory slices
// from Start.
type MIGPlacement struct {
	Start int `json:"start"`
	Size  int `json:"size"`
}

// Overlaps tells whether two placements share a memory slice.
func (p MIGPlacement) Overlaps(q MIGPlacement) bool {
	return p.Start < q.Start+q.Size && q.Start < p.Start+p.Size
}

// String is "<start>:<size>".
func (p MIGPlacement) String() string { return fmt.Sprintf("%d:%d", p.Start, p.Size) }

// MIGDevice is one MIG device of a GPU with MIG enabled: a compute instance
// inside a GPU instance. A container reaches it through its parent GPU's
// node, nvidiactl, and the two capability nodes of its GPU instance and
// compute instance.
type MIGDevice struct {
	// Parent is the parent GPU's NVML index; ParentUUID its "GPU-" UUID.
	Parent     int    `json:"parent"`
	ParentUUID string `json:"parentUuid,omitempty"`
	// UUID is NVML's "MIG-..." identifier of the device.
	UUID string `json:"uuid"`
	// GI and CI are the GPU-instance and compute-instance ids.
	GI int `json:"gi"`
	CI int `json:"ci"`
	// Profile is the GPU instance's profile name ("1g.10gb"); ProfileID its
	// NVML id.
	Profile   string `json:"profile"`
	ProfileID int    `json:"profileId"`
	// Placement is where the GPU instance sits on the parent.
	Placement MIGPlacement `json:"placement"`
	// MemoryBytes is the device's memory; SMs its multiprocessors.
	MemoryBytes uint64 `json:"memoryBytes,omitempty"`
	SMs         int    `json:"sms,omitempty"`
	// GIAccess and CIAccess are the capability nodes
	// (/dev/nvidia-caps/nvidia-cap<M>) that grant access to the GPU
	// instance and the compute instance. A Path is empty when discovery
	// could not find the minor.
	GIAccess DeviceNode `json:"giAccess"`
	CIAccess DeviceNode `json:"ciAccess"`
	// Health tells whether the device may be handed out; the parent's
	// health applies on top of it.
	Health Health `json:"health"`
}

// Ref is the MIG device as an allocation carries it, beside its parent.
func (m MIGDevice) Ref() MIGRef {
	return MIGRef{ParentUUID: m.ParentUUID, GI: m.GI, CI: m.CI, Profile: m.Profile, MemoryBytes: m.MemoryBytes, GIAccess: m.GIAccess, CIAccess: m.CIAccess}
}

// MIGRef is what an isolator needs of an allocated MIG device beyond its
// parent: the instance and its capability nodes. A DeviceRef with a MIGRef
// names the MIG device by its "MIG-" UUID and carries the parent's index,
// minor, bus id and node.
type MIGRef struct {
	ParentUUID  string     `json:"parentUuid"`
	GI          int        `json:"gi"`
	CI          int        `json:"ci"`
	Profile     string     `json:"profile"`
	MemoryBytes uint64     `json:"memoryBytes,omitempty"`
	GIAccess    DeviceNode `json:"giAccess"`
	CIAccess    DeviceNode `json:"ciAccess"`
}

// CapNodes are the capability nodes of the device that are known (a Path),
// GI first.
func (r *MIGRef) CapNodes() []DeviceNode {
	if r == nil {
		return nil
	}
	var out []DeviceNode
	for _, n := range []DeviceNode{r.GIAccess, r.CIAccess} {
		if n.Path != "" {
			out = append(out, n)
		}
	}
	return out
}

// MIGRef returns the allocation form of MIG device m of d: d's identity
// with m's UUID and MIG data.
func (d Device) MIGRef(m MIGDevice) DeviceRef {
	ref := d.Ref()
	ref.UUID = m.UUID
	r := m.Ref()
	ref.MIG = &r
	return ref
}

// MIGProfile returns the GPU's profile called name.
func (d Device) MIGProfile(name string) (MIGProfile, bool) {
	i := slices.IndexFunc(d.MIGProfiles, func(p MIGProfile) bool { return p.Name == name })
	if i < 0 {
		return MIGProfile{}, false
	}
	return d.MIGProfiles[i], true
}

// IsMIGUUID tells whether s names a MIG device ("MIG-...").
func IsMIGUUID(s string) bool { return strings.HasPrefix(s, "MIG-") }

// MIGProfileName is the profile name NVIDIA gives a GPU instance of slices
// compute slices and memory bytes ("3g.40gb"), with suffix ("+me") appended.
func MIGProfileName(slices int, memory uint64, suffix string) string {
	gb := (memory + 1<<30 - 1) >> 30
	return strconv.Itoa(slices) + "g." + strconv.FormatUint(gb, 10) + "gb" + suffix
}

// ParseMIGMinors reads the driver's /proc/driver/nvidia-caps/mig-minors:
// "config 1", "monitor 2", "gpu<G>/gi<I>/access <M>" and
// "gpu<G>/gi<I>/ci<C>/access <M>" lines, into a map from the name (the first
// field) to the capability node's minor.
func ParseMIGMinors(text string) (map[string]uint32, error) {
	out := map[string]uint32{}
	for n, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("mig-minors line %d %q: want \"<name> <minor>\": %w", n+1, line, ErrInvalid)
		}
		m, err := strconv.ParseUint(f[1], 10, 20)
		if err != nil {
			return nil, fmt.Errorf("mig-minors line %d %q: bad minor: %w", n+1, line, ErrInvalid)
		}
		out[f[0]] = uint32(m)
	}
	return out, nil
}

// MIGGIAccessName and MIGCIAccessName are the mig-minors names of the
// access capabilities of GPU instance gi and its compute instance ci on the
// GPU with device minor gpu.
func MIGGIAccessName(gpu, gi int) string { return fmt.Sprintf("gpu%d/gi%d/access", gpu, gi) }

// MIGCIAccessName is the mig-minors name of the access capability of
// compute instance ci of GPU instance gi (see MIGGIAccessName).
func MIGCIAccessName(gpu, gi, ci int) string {
	return fmt.Sprintf("gpu%d/gi%d/ci%d/access", gpu, gi, ci)
}
