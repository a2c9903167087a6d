package node

import (
	"errors"
	"testing"
)

func TestNormalizeBusID(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"nvml 8-digit domain", "00000000:06:00.0", "0000:06:00.0"},
		{"upper case", "0000:AF:1F.7", "0000:af:1f.7"},
		{"no domain", "3b:00.0", "0000:3b:00.0"},
		{"short fields", "0:6:0.0", "0000:06:00.0"},
		{"wide domain kept", "0001abcd:06:00.0", "1abcd:06:00.0"},
		{"surrounding space", " 0000:06:00.0\n", "0000:06:00.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NormalizeBusID(tt.in)
			if err != nil || got != tt.want {
				t.Fatalf("NormalizeBusID(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
	for _, bad := range []string{"", "0000", "0000:06:00", "0000:06.0", "xx:00.0", "0000:100:00.0", "0000:06:20.0", "0000:06:00.8", "123456789:06:00.0", "0000:06:00.0:1", ":06:00.0"} {
		t.Run("invalid "+bad, func(t *testing.T) {
			if got, err := NormalizeBusID(bad); !errors.Is(err, ErrInvalidBusID) {
				t.Fatalf("NormalizeBusID(%q) = %q, %v; want ErrInvalidBusID", bad, got, err)
			}
		})
	}
}
