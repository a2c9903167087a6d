package native

import (
	"testing"
)

// TestNoDeviceFileChanges: the driver's parameters as a container's /proc
// shows them say ModifyDeviceFiles: 0, and nothing else changes.
func TestNoDeviceFileChanges(t *testing.T) {
	// As a real H100 node's driver 580 writes them (abridged).
	real := "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\nDeviceFileUID: 0\nDeviceFileGID: 0\nDeviceFileMode: 438\n"
	for _, tc := range []struct {
		name, in, want string
		changed        bool
	}{
		{"driver 580", real, "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 0\nDeviceFileUID: 0\nDeviceFileGID: 0\nDeviceFileMode: 438\n", true},
		{"already 0", "ModifyDeviceFiles: 0\nDeviceFileMode: 438\n", "ModifyDeviceFiles: 0\nDeviceFileMode: 438\n", false},
		{"module parameter names", "NVreg_ModifyDeviceFiles: 1\n", "NVreg_ModifyDeviceFiles: 0\n", true},
		{"no such line", "DeviceFileMode: 438\n", "DeviceFileMode: 438\n", false},
		{"no final newline, other spacing", "ModifyDeviceFiles:1", "ModifyDeviceFiles: 0", true},
		{"a longer name", "ModifyDeviceFilesX: 1\n", "ModifyDeviceFilesX: 1\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, changed := noDeviceFileChanges([]byte(tc.in))
			if string(got) != tc.want || changed != tc.changed {
				t.Errorf("noDeviceFileChanges(%q) = %q, %v; want %q, %v", tc.in, got, changed, tc.want, tc.changed)
			}
		})
	}
}
