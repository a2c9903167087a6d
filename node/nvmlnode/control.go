package nvmlnode

import (
	"errors"
	"io/fs"
	"path/filepath"
	"strconv"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// NVIDIA's device numbers, as the kernel driver registers them. Discovery
// reads the major of the running driver from /proc/devices ("nvidia" or
// "nvidia-frontend") and falls back to DefaultMajor only when the driver is
// not loaded; nothing outside discovery uses these numbers.
const (
	DefaultMajor = 195 // /dev/nvidia<minor>, nvidiactl, nvidia-modeset
	CtlMinor     = 255
	ModesetMinor = 254
)

// nvidiaMajor is the major of the NVIDIA driver's own nodes: the "nvidia"
// (or, with the frontend module, "nvidia-frontend") line of /proc/devices,
// or DefaultMajor.
func nvidiaMajor(majors map[string]uint32) uint32 {
	for _, name := range []string{"nvidia", "nvidia-frontend"} {
		if m, ok := majors[name]; ok {
			return m
		}
	}
	return DefaultMajor
}

// readMajors reads the dynamic majors of /proc/devices; a missing file
// leaves only the defaults.
func (d *discovery) readMajors() {
	majors, err := node.ReadProcDevices(d.procRoot)
	if err != nil {
		d.warn("dynamic device majors: %v", err)
	}
	d.majors = majors
	d.major = nvidiaMajor(majors)
}

// gpuNode is the device node of the GPU with the given minor: what the dev
// root holds when it is a character device with that minor, else the node
// the driver's numbers say it must be.
func (d *discovery) gpuNode(minor int) node.DeviceNode {
	if minor < 0 {
		return node.DeviceNode{}
	}
	path := filepath.Join(d.devRoot, "nvidia"+strconv.Itoa(minor))
	if num, err := linux.StatDevice(path); err == nil && num.Char && num.Minor == uint32(minor) {
		return node.DeviceNode{Path: path, Major: num.Major, Minor: num.Minor}
	}
	return node.DeviceNode{Path: path, Major: d.major, Minor: uint32(minor)}
}

// controlDevices stats the control nodes under the dev root. Their numbers
// are checked against the driver's majors from /proc/devices (nvidia for
// nvidiactl and nvidia-modeset, nvidia-uvm for the uvm nodes). A node that
// is absent is left out; one whose numbers are wrong (stale, from another
// driver load) is left out with a warning.
func (d *discovery) controlDevices() []node.ControlDevice {
	uvmMajor, haveUVM := d.majors[node.NVIDIAUVM]
	type want struct {
		name         string
		major, minor uint32
		knownMajor   bool
	}
	wants := []want{
		{node.NVIDIACtl, d.major, CtlMinor, true},
		{node.NVIDIAUVM, uvmMajor, 0, haveUVM},
		{node.NVIDIAUVMTools, uvmMajor, 1, haveUVM},
		{node.NVIDIAModeset, d.major, ModesetMinor, true},
	}
	var out []node.ControlDevice
	for _, w := range wants {
		path := filepath.Join(d.devRoot, w.name)
		num, err := linux.StatDevice(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			d.warn("control device %s: %v", w.name, err)
			continue
		case !num.Char:
			d.warn("control device %s: not a character device", path)
			continue
		case num.Minor != w.minor || (w.knownMajor && num.Major != w.major):
			d.warn("control device %s is %d:%d, want %d:%d: stale node left out", path, num.Major, num.Minor, w.major, w.minor)
			continue
		}
		out = append(out, node.ControlDevice{Name: w.name, Path: path, Major: num.Major, Minor: num.Minor})
	}
	return out
}
