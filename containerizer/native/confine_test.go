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

// TestHiddenDirs: a container with the host's view has its own manager's
// directory, gpuiso's default state directories and every registered MPS
// directory masked, each once; nothing that would hide the host or what
// the container needs of its own.
func TestHiddenDirs(t *testing.T) {
	defaults := GPUISOStateDirs()
	for _, tc := range []struct {
		name       string
		own        string
		registered []string
		want       []string
	}{
		{name: "defaults", want: defaults},
		{name: "own and registered", own: "/var/lib/gpuiso/gpurun/mps", registered: []string{"/srv/runtime/mps", "/opt/x/mps/"},
			want: append(slices.Clone(defaults), "/var/lib/gpuiso/gpurun/mps", "/srv/runtime/mps", "/opt/x/mps")},
		{name: "duplicates", own: "/srv/a", registered: []string{"/srv/a", "/var/lib/gpuiso"}, want: append(slices.Clone(defaults), "/srv/a")},
		{name: "never the host or a container's own", registered: []string{"/", "/tmp", "/dev", "/sys/x/..", "relative", ""}, want: defaults},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := slices.Sorted(slices.Values(tc.want))
			if got := hiddenDirs(tc.own, tc.registered); !slices.Equal(got, want) {
				t.Errorf("hiddenDirs = %v, want %v", got, want)
			}
		})
	}
}
