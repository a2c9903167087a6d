package node

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestReadProcDevices(t *testing.T) {
	tests := []struct {
		host string
		want map[string]uint32
		none []string
	}{
		{"dgx-a100", map[string]uint32{"nvidia-uvm": 236, "nvidia-frontend": 195, "nvidia-caps": 235, "mem": 1}, []string{"sd", "loop"}},
		{"no-driver", map[string]uint32{"pts": 136}, []string{"nvidia-uvm", "device-mapper"}},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			got, err := ReadProcDevices(filepath.Join("..", "testdata", "hosts", tt.host, "proc"))
			if err != nil {
				t.Fatal(err)
			}
			for name, major := range tt.want {
				if got[name] != major {
					t.Errorf("major of %s = %d, want %d", name, got[name], major)
				}
			}
			for _, name := range tt.none {
				if _, ok := got[name]; ok {
					t.Errorf("%s listed among character devices", name)
				}
			}
		})
	}
}

func TestParseProcDevicesRejects(t *testing.T) {
	for name, in := range map[string]string{
		"no major":  "Character devices:\nnvidia-uvm\n",
		"bad major": "Character devices:\nx nvidia-uvm\n",
		"huge":      "Character devices:\n99999999999 nvidia-uvm\n",
		"no name":   "Character devices:\n236 \n",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := ParseProcDevices(strings.NewReader(in)); err == nil {
				t.Fatalf("ParseProcDevices(%q) accepted", in)
			}
		})
	}
}

func TestParseCharacterDevices(t *testing.T) {
	in := "Character devices:\n  1 mem\n  5 /dev/tty\n231 infiniband_mad\n245 infiniband_mad\n236 nvidia-uvm\n236 nvidia-uvm-alias\n\nBlock devices:\n  8 sd\n"
	got, err := ParseCharacterDevices(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []CharacterDevice{{1, "mem"}, {5, "/dev/tty"}, {231, "infiniband_mad"}, {245, "infiniband_mad"}, {236, "nvidia-uvm"}, {236, "nvidia-uvm-alias"}}
	if !slices.Equal(got, want) {
		t.Errorf("ParseCharacterDevices = %v, want %v", got, want)
	}
	byName, err := ParseProcDevices(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if byName["infiniband_mad"] != 231 || len(byName) != 5 {
		t.Errorf("ParseProcDevices = %v, want the first major of a repeated name", byName)
	}
	if _, err := ParseCharacterDevices(strings.NewReader("Character devices:\nx mem\n")); !errors.Is(err, ErrInvalid) {
		t.Errorf("a bad line: %v, want ErrInvalid", err)
	}
}

// FuzzParseProcDevices: whatever the input, the parser returns entries
// with a name and no line break, or an error matching ErrInvalid; what it
// returns, written back as /proc/devices lines, parses to the same; the
// map by name keeps each name's first major.
func FuzzParseProcDevices(f *testing.F) {
	f.Add([]byte("Character devices:\n  1 mem\n236 nvidia-uvm\n\nBlock devices:\n  8 sd\n"))
	f.Add([]byte("Character devices:\n"))
	f.Add([]byte("Block devices:\n259 blkext\n"))
	f.Add([]byte("Character devices:\n231 ib\n245 ib\n 5 a b\n"))
	f.Add([]byte("Character devices:\nx mem\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		devs, err := ParseCharacterDevices(bytes.NewReader(b))
		byName, mapErr := ParseProcDevices(bytes.NewReader(b))
		if (err == nil) != (mapErr == nil) {
			t.Fatalf("ParseCharacterDevices: %v, ParseProcDevices: %v", err, mapErr)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !strings.Contains(err.Error(), "read proc devices") {
				t.Fatalf("error %v matches neither ErrInvalid nor a read error", err)
			}
			return
		}
		var again strings.Builder
		again.WriteString("Character devices:\n")
		first := map[string]uint32{}
		for _, d := range devs {
			if d.Name == "" || strings.ContainsAny(d.Name, "\n") || d.Name != strings.TrimSpace(d.Name) {
				t.Fatalf("parsed a bad name %q from %q", d.Name, b)
			}
			if _, ok := first[d.Name]; !ok {
				first[d.Name] = d.Major
			}
			fmt.Fprintf(&again, "%3d %s\n", d.Major, d.Name)
		}
		if !maps.Equal(first, byName) {
			t.Fatalf("ParseProcDevices = %v, want each name's first major %v", byName, first)
		}
		back, err := ParseCharacterDevices(strings.NewReader(again.String()))
		if err != nil || !slices.Equal(back, devs) {
			t.Fatalf("written back %q parses to %v, %v; want %v", again.String(), back, err, devs)
		}
	})
}
