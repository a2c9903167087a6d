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
