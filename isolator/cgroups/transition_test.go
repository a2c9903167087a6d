package cgroups

import (
	"fmt"
	"testing"

	"github.com/gpuiso/gpuiso/isolator"
)

func TestV1Transition(t *testing.T) {
	gpu := func(minor int64) isolator.Rule { return isolator.Allow(195, minor, "rwm") }
	all := isolator.Rule{Allow: true, Type: 'a', Major: isolator.Wildcard, Minor: isolator.Wildcard, Access: "rwm"}
	tests := []struct {
		name       string
		have, want []isolator.Rule
		fresh      bool
		writes     string
	}{
		{"fresh cgroup", nil, []isolator.Rule{gpu(0), gpu(1)}, true,
			"[{devices.deny a} {devices.allow c 195:0 rwm} {devices.allow c 195:1 rwm}]"},
		{"inherited allow-all", []isolator.Rule{all}, []isolator.Rule{gpu(1)}, false,
			"[{devices.deny a} {devices.allow c 195:1 rwm}]"},
		{"unchanged", []isolator.Rule{gpu(0), gpu(1)}, []isolator.Rule{gpu(0), gpu(1)}, false, "[]"},
		{"grow", []isolator.Rule{gpu(0)}, []isolator.Rule{gpu(0), gpu(1)}, false,
			"[{devices.allow c 195:1 rwm}]"},
		{"shrink", []isolator.Rule{gpu(0), gpu(1)}, []isolator.Rule{gpu(1)}, false,
			"[{devices.deny c 195:0 rwm}]"},
		{"swap: allow before deny", []isolator.Rule{gpu(0), gpu(2)}, []isolator.Rule{gpu(2), gpu(3)}, false,
			"[{devices.allow c 195:3 rwm} {devices.deny c 195:0 rwm}]"},
		{"to nothing", []isolator.Rule{gpu(0)}, nil, false, "[{devices.deny c 195:0 rwm}]"},
		{"fresh to nothing", nil, nil, true, "[{devices.deny a}]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := fmt.Sprint(v1Transition(tt.have, tt.want, tt.fresh)); got != tt.writes {
				t.Fatalf("writes %s, want %s", got, tt.writes)
			}
		})
	}
}
