package allocator

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// NVIDIA's fixed device numbers.
const (
	NVIDIAMajor        = 195 // /dev/nvidia<minor>, nvidiactl, nvidia-modeset
	NVIDIACtlMinor     = 255
	NVIDIAModesetMinor = 254
)

// Control device node names.
const (
	NVIDIACtl      = "nvidiactl"
	NVIDIAUVM      = "nvidia-uvm"
	NVIDIAUVMTools = "nvidia-uvm-tools"
	NVIDIAModeset  = "nvidia-modeset"
)

// controlDevices stats the control nodes under the dev root. Fixed numbers
// are checked against NVIDIA's; nvidia-uvm's dynamic major against the
// "nvidia-uvm" line of /proc/devices. A node that is absent is left out; one
// whose numbers are wrong (stale, from another driver load) is left out with
// a warning.
func (d *discovery) controlDevices() []ControlDevice {
	majors, err := ReadProcDevices(d.procRoot)
	if err != nil {
		d.warn("dynamic device majors: %v", err)
	}
	uvmMajor, haveUVM := majors[NVIDIAUVM]
	type want struct {
		name         string
		major, minor uint32
		knownMajor   bool
	}
	wants := []want{
		{NVIDIACtl, NVIDIAMajor, NVIDIACtlMinor, true},
		{NVIDIAUVM, uvmMajor, 0, haveUVM},
		{NVIDIAUVMTools, uvmMajor, 1, haveUVM},
		{NVIDIAModeset, NVIDIAMajor, NVIDIAModesetMinor, true},
	}
	var out []ControlDevice
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
		out = append(out, ControlDevice{Name: w.name, Path: path, Major: num.Major, Minor: num.Minor})
	}
	return out
}

// ReadProcDevices reads the character-device majors of <procRoot>/devices
// by driver name: where dynamic majors such as nvidia-uvm's are found.
func ReadProcDevices(procRoot string) (map[string]uint32, error) {
	f, err := os.Open(filepath.Join(procRoot, "devices"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseProcDevices(f)
}

// ParseProcDevices reads the character-device section of /proc/devices
// ("<major> <name>" lines after "Character devices:") into a map by name.
func ParseProcDevices(r io.Reader) (map[string]uint32, error) {
	out := map[string]uint32{}
	sc := bufio.NewScanner(r)
	inChar := false
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
			continue
		case strings.HasSuffix(line, "devices:"):
			inChar = line == "Character devices:"
			continue
		case !inChar:
			continue
		}
		major, name, ok := strings.Cut(line, " ")
		name = strings.TrimSpace(name)
		m, err := strconv.ParseUint(major, 10, 32)
		if !ok || err != nil || name == "" {
			return nil, fmt.Errorf("proc devices line %d %q: want \"<major> <name>\"", n, line)
		}
		if _, dup := out[name]; !dup {
			out[name] = uint32(m)
		}
	}
	return out, sc.Err()
}
