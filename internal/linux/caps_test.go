package linux

import (
	"errors"
	"testing"
)

func TestCapability(t *testing.T) {
	for _, tc := range []struct {
		name string
		want int
		err  bool
	}{
		{"CHOWN", 0, false},
		{"CAP_SYS_ADMIN", 21, false},
		{"sys_ptrace", 19, false},
		{"cap_checkpoint_restore", 40, false},
		{"SYS_NOPE", 0, true},
		{"", 0, true},
	} {
		got, err := Capability(tc.name)
		if tc.err {
			if !errors.Is(err, ErrUnknownCapability) {
				t.Errorf("Capability(%q) = %d, %v; want ErrUnknownCapability", tc.name, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Capability(%q) = %d, %v; want %d", tc.name, got, err, tc.want)
		}
		if name := CapabilityName(got); name == "" {
			t.Errorf("CapabilityName(%d) is empty", got)
		}
	}
	if CapabilityName(99) != "" {
		t.Error("CapabilityName(99) names something")
	}
}
