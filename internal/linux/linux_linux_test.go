package linux

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestStatDeviceNull(t *testing.T) {
	dev, err := StatDevice("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	if want := (DeviceNumber{Char: true, Major: 1, Minor: 3}); dev != want {
		t.Fatalf("StatDevice(/dev/null) = %+v, want %+v", dev, want)
	}
}

func TestStatDeviceRejectsRegularFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := StatDevice(p); !errors.Is(err, fs.ErrInvalid) {
		t.Fatalf("StatDevice(regular file) = %v, want fs.ErrInvalid", err)
	}
	if _, err := StatDevice(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("StatDevice(missing) = %v, want fs.ErrNotExist", err)
	}
}

func TestFilesystemType(t *testing.T) {
	if _, err := FilesystemType("/"); err != nil {
		t.Fatal(err)
	}
}
