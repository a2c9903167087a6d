package mps_test

import (
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/isolator/mps"
)

// TestCgroupOptions: a cgroup parent must be an absolute, clean path, and
// the cgroup root and namespaces absolute; anything else is ErrInvalid
// before anything is made.
func TestCgroupOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  mps.Option
	}{
		{"relative parent", mps.WithCgroup("kubepods")},
		{"parent leaving the hierarchy", mps.WithCgroup("/a/../..")},
		{"parent with a trailing slash", mps.WithCgroup("/a/")},
		{"empty parent", mps.WithCgroup("")},
		{"relative root", mps.WithCgroupRoot("sys/fs/cgroup")},
		{"relative namespace", mps.WithCgroupNamespace("ns/cgroup")},
		{"relative mount namespace", mps.WithMountNamespace("ns/mnt", "")},
		{"relative driver root of the mount namespace", mps.WithMountNamespace("/proc/1/ns/mnt", "driver")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir() + "/mps"
			_, err := mps.New(dir, mps.WithControl("/bin/true"), tc.opt)
			if !errors.Is(err, mps.ErrInvalid) {
				t.Fatalf("got %v, want ErrInvalid", err)
			}
		})
	}
}
