package native

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testenv"
)

// TestKeepDeviceNodes: over a /proc's driver parameters goes a read-only
// copy that says ModifyDeviceFiles: 0; a /proc without an NVIDIA driver is
// left as it is. The /proc here is a directory of the test's (the bind is
// undone when it ends).
func TestKeepDeviceNodes(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	proc := filepath.Join(dir, "proc")
	params := filepath.Join(proc, driverParams)
	if err := os.MkdirAll(filepath.Dir(params), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(params, []byte("RmLogonRC: 1\nModifyDeviceFiles: 1\nDeviceFileMode: 438\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	scratch := filepath.Join(dir, driverParamsCopy)
	if err := keepDeviceNodes(proc, scratch); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { linux.DetachUnmount(params) })
	b, err := os.ReadFile(params)
	if err != nil || string(b) != "RmLogonRC: 1\nModifyDeviceFiles: 0\nDeviceFileMode: 438\n" {
		t.Errorf("the driver's parameters now read %q, %v", b, err)
	}
	if err := os.WriteFile(params, []byte("ModifyDeviceFiles: 1\n"), 0o644); err == nil {
		t.Error("the copy over the driver's parameters is writable")
	}
	none := filepath.Join(dir, "no-driver")
	if err := os.Mkdir(none, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := keepDeviceNodes(none, filepath.Join(dir, "unused")); err != nil {
		t.Errorf("a /proc without the NVIDIA driver: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "unused")); err == nil {
		t.Error("a copy was written for a /proc without the NVIDIA driver")
	}
}
