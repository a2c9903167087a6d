package isolator

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/node"
)

func TestParseRule(t *testing.T) {
	tests := []struct {
		in   string
		want Rule
	}{
		{"c 195:1 rwm", Allow(195, 1, "rwm")},
		{"a *:* rwm", Rule{Allow: true, Type: 'a', Major: Wildcard, Minor: Wildcard, Access: "rwm"}},
		{"c 136:* rw", Allow(136, Wildcard, "rw")},
		{"b *:* m", Rule{Allow: true, Type: 'b', Major: Wildcard, Minor: Wildcard, Access: "m"}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseRule(tt.in)
			if err != nil || got != tt.want {
				t.Fatalf("ParseRule(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			}
			if got.String() != tt.in {
				t.Fatalf("String() = %q, want %q", got.String(), tt.in)
			}
		})
	}
	for _, bad := range []string{"", "c 195:1", "x 195:1 rwm", "c 195 rwm", "c 195:1 rwx", "c 195:1 mr", "c 195:1 rr", "c -2:1 r", "c 195:99999999999 r", "cc 1:1 r"} {
		t.Run("invalid "+bad, func(t *testing.T) {
			if _, err := ParseRule(bad); !errors.Is(err, ErrInvalidRule) {
				t.Fatalf("ParseRule(%q) = %v, want ErrInvalidRule", bad, err)
			}
		})
	}
}

// TestGPURules pins the allow list of a container with GPUs 1 and 3.
func TestGPURules(t *testing.T) {
	control := []node.ControlDevice{
		{Name: node.NVIDIACtl, Major: 195, Minor: 255},
		{Name: node.NVIDIAUVM, Major: 236, Minor: 0},
		{Name: node.NVIDIAUVMTools, Major: 236, Minor: 1},
		{Name: node.NVIDIAModeset, Major: 195, Minor: 254},
	}
	gpus := []node.DeviceRef{{Index: 3, Minor: 3, Node: node.DeviceNode{Path: "/dev/nvidia3", Major: 195, Minor: 3}}, {Index: 1, Minor: 1, Node: node.DeviceNode{Path: "/dev/nvidia1", Major: 195, Minor: 1}}, {Index: 5, Minor: node.NoMinor}}
	var got []string
	for _, r := range GPURules(control, gpus) {
		got = append(got, r.String())
	}
	want := []string{
		"b *:* m", "c *:* m",
		"c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm",
		"c 5:0 rwm", "c 5:1 rwm", "c 5:2 rwm", "c 10:200 rwm", "c 136:* rwm",
		"c 195:1 rwm", "c 195:3 rwm", "c 195:255 rwm",
		"c 236:0 rwm", "c 236:1 rwm",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("GPURules =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestParseDevicesList(t *testing.T) {
	rules, err := ParseDevicesList(strings.NewReader("c 1:3 rwm\nc 195:1 rwm\n\n"))
	if err != nil || len(rules) != 2 || rules[1] != Allow(195, 1, "rwm") {
		t.Fatalf("ParseDevicesList = %v, %v", rules, err)
	}
	if _, err := ParseDevicesList(strings.NewReader("c 1:3 rwm\ngarbage\n")); !errors.Is(err, ErrInvalidRule) {
		t.Fatalf("ParseDevicesList(garbage) = %v", err)
	}
}

func FuzzParseDevicesList(f *testing.F) {
	f.Add("a *:* rwm\n")
	f.Add("c 1:3 rwm\nc 195:1 rwm\nc 136:* rwm\n")
	f.Add("b 8:0 m")
	f.Fuzz(func(t *testing.T, s string) {
		rules, err := ParseDevicesList(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, r := range rules {
			back, err := ParseRule(r.String())
			if err != nil || back != r {
				t.Fatalf("rule %+v does not round-trip: %q -> %+v, %v", r, r.String(), back, err)
			}
		}
	})
}
