package node

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Default host paths. Every package that reads them takes an option to move
// them to a test tree.
const (
	DefaultDevRoot  = "/dev"
	DefaultProcRoot = "/proc"
	DefaultSysRoot  = "/sys"
)

// Inventory is what a node has: its GPUs in NVML index order, their topology,
// the driver, and the control device nodes present under the dev root.
type Inventory struct {
	// Devices are the GPUs in NVML index order; Topology is indexed by
	// position in this slice.
	Devices []Device `json:"devices"`
	// Topology holds the link of every pair of Devices.
	Topology *Topology `json:"topology"`
	// DriverVersion is the kernel driver's version, e.g. "535.104.05".
	DriverVersion string `json:"driverVersion"`
	// CUDAVersion is the newest CUDA version the driver supports.
	CUDAVersion CUDAVersion `json:"cudaVersion"`
	// ControlDevices are the driver's control nodes found under the dev root.
	ControlDevices []ControlDevice `json:"controlDevices"`
	// Warnings are what discovery could not read and left out, one a line.
	Warnings []string `json:"warnings,omitempty"`
}

// Clone returns a deep copy of inv.
func (inv *Inventory) Clone() *Inventory {
	c := *inv
	c.Devices = make([]Device, len(inv.Devices))
	for i, d := range inv.Devices {
		c.Devices[i] = d.Clone()
	}
	c.ControlDevices = append([]ControlDevice(nil), inv.ControlDevices...)
	c.Warnings = append([]string(nil), inv.Warnings...)
	return &c // Topology is immutable and shared.
}

// Healthy returns the positions of the devices that may be handed out.
func (inv *Inventory) Healthy() []int {
	var out []int
	for i, d := range inv.Devices {
		if d.Health.Healthy {
			out = append(out, i)
		}
	}
	return out
}

// ControlDevice is one of the driver's control nodes: nvidiactl, nvidia-uvm,
// nvidia-uvm-tools or nvidia-modeset.
type ControlDevice struct {
	Name  string `json:"name"`
	Path  string `json:"path"`
	Major uint32 `json:"major"`
	Minor uint32 `json:"minor"`
}

// CUDAVersion is a CUDA version as NVML encodes it: 1000*major + 10*minor
// (12020 is CUDA 12.2). JSON carries it as "12.2".
type CUDAVersion int

// Major is the major version.
func (v CUDAVersion) Major() int { return int(v) / 1000 }

// Minor is the minor version.
func (v CUDAVersion) Minor() int { return int(v) % 1000 / 10 }

// String is "<major>.<minor>", or "" for the zero version.
func (v CUDAVersion) String() string {
	if v <= 0 {
		return ""
	}
	return fmt.Sprintf("%d.%d", v.Major(), v.Minor())
}

// ParseCUDAVersion reads "12.2" (or "12") as a CUDAVersion.
func ParseCUDAVersion(s string) (CUDAVersion, error) {
	major, minor, hasMinor := strings.Cut(strings.TrimSpace(s), ".")
	ma, err := strconv.Atoi(major)
	if err != nil || ma < 0 || ma > 1_000_000 {
		return 0, fmt.Errorf("CUDA version %q: want <major>.<minor>", s)
	}
	mi := 0
	if hasMinor {
		if mi, err = strconv.Atoi(minor); err != nil || mi < 0 || mi > 99 {
			return 0, fmt.Errorf("CUDA version %q: want <major>.<minor>", s)
		}
	}
	return CUDAVersion(ma*1000 + mi*10), nil
}

// MarshalJSON writes the version as "12.2".
func (v CUDAVersion) MarshalJSON() ([]byte, error) { return json.Marshal(v.String()) }

// UnmarshalJSON reads "12.2" or "".
func (v *CUDAVersion) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	if s == "" {
		*v = 0
		return nil
	}
	p, err := ParseCUDAVersion(s)
	if err != nil {
		return err
	}
	*v = p
	return nil
}
