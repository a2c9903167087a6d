package node

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Control device node names.
const (
	NVIDIACtl      = "nvidiactl"
	NVIDIAUVM      = "nvidia-uvm"
	NVIDIAUVMTools = "nvidia-uvm-tools"
	NVIDIAModeset  = "nvidia-modeset"
)

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

// CharacterDevice is one line of the character-device section of
// /proc/devices: a major and the name of the driver that registered it.
// One driver may register several majors under one name (infiniband_mad),
// and several names may share one major.
type CharacterDevice struct {
	Major uint32
	Name  string
}

// ParseCharacterDevices reads every line of the character-device section of
// /proc/devices ("<major> <name>" lines after "Character devices:"), in
// order; other sections are skipped. A line of that section that is not
// "<major> <name>" is an error matching ErrInvalid.
func ParseCharacterDevices(r io.Reader) ([]CharacterDevice, error) {
	var out []CharacterDevice
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
			return nil, fmt.Errorf("proc devices line %d %q: want \"<major> <name>\": %w", n, line, ErrInvalid)
		}
		out = append(out, CharacterDevice{Major: uint32(m), Name: name})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read proc devices: %w", err)
	}
	return out, nil
}

// ParseProcDevices reads the character-device section of /proc/devices
// ("<major> <name>" lines after "Character devices:") into a map by name;
// of a name listed twice, the first major is kept. It is
// ParseCharacterDevices by name.
func ParseProcDevices(r io.Reader) (map[string]uint32, error) {
	devs, err := ParseCharacterDevices(r)
	if err != nil {
		return nil, err
	}
	out := map[string]uint32{}
	for _, d := range devs {
		if _, dup := out[d.Name]; !dup {
			out[d.Name] = d.Major
		}
	}
	return out, nil
}
