package native

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpuiso/gpuiso/containerizer"
)

func TestConfinementOf(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name     string
		spec     containerizer.Spec
		wantCaps int
		bad      bool
	}{
		{name: "default", wantCaps: 14},
		{name: "cap added", spec: containerizer.Spec{CapAdd: []string{"SYS_PTRACE", "CAP_SYS_PTRACE", "chown"}}, wantCaps: 15},
		{name: "root file system", spec: containerizer.Spec{RootFS: dir}, wantCaps: 14},
		{name: "unknown cap", spec: containerizer.Spec{CapAdd: []string{"SYS_NOPE"}}, bad: true},
		{name: "relative root", spec: containerizer.Spec{RootFS: "rootfs"}, bad: true},
		{name: "missing root", spec: containerizer.Spec{RootFS: filepath.Join(dir, "missing")}, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cf, err := confinementOf(tc.spec)
			if tc.bad {
				if !errors.Is(err, containerizer.ErrInvalidSpec) {
					t.Fatalf("confinementOf = %+v, %v; want ErrInvalidSpec", cf, err)
				}
				return
			}
			if err != nil || len(cf.Caps) != tc.wantCaps || !slices.IsSorted(cf.Caps) || cf.RootFS != tc.spec.RootFS {
				t.Fatalf("confinementOf = %+v, %v; want %d capabilities", cf, err, tc.wantCaps)
			}
		})
	}
}
