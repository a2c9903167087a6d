package volume

import (
	"context"
	"debug/elf"
	"errors"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestMakeELF(t *testing.T) {
	for _, class := range []elf.Class{elf.ELFCLASS32, elf.ELFCLASS64} {
		b := makeELF(class, "libx.so.1", "liba.so.1", "libb.so.2")
		f, err := elf.NewFile(strings.NewReader(string(b)))
		if err != nil {
			t.Fatalf("%v: %v", class, err)
		}
		soname, err1 := f.DynString(elf.DT_SONAME)
		needed, err2 := f.DynString(elf.DT_NEEDED)
		if f.Class != class || err1 != nil || err2 != nil ||
			!slices.Equal(soname, []string{"libx.so.1"}) || !slices.Equal(needed, []string{"liba.so.1", "libb.so.2"}) {
			t.Fatalf("%v: class %v soname %q (%v) needed %q (%v)", class, f.Class, soname, err1, needed, err2)
		}
	}
}

func TestContents(t *testing.T) {
	const v = "535.309.01"
	tr := driverTree(t, v)
	cur := filepath.Join(tr.root, "usr/lib/x86_64-linux-gnu/nvidia/current")
	x64 := filepath.Join(tr.root, "usr/lib/x86_64-linux-gnu")
	all := Files{
		{Path: "bin/nvidia-smi", Source: filepath.Join(tr.root, "usr/lib/nvidia/current/nvidia-smi"), Capability: Utility},
		{Path: "lib/libcuda.so." + v, Source: filepath.Join(tr.root, "usr/lib/i386-linux-gnu/libcuda.so."+v), Capability: Compute},
		{Path: "lib64/libGL.so.1.7.0", Source: filepath.Join(x64, "libGL.so.1.7.0"), Capability: Graphics},
		{Path: "lib64/libGLX_nvidia.so." + v, Source: filepath.Join(cur, "libGLX_nvidia.so."+v), Capability: Graphics},
		{Path: "lib64/libcuda.so." + v, Source: filepath.Join(cur, "libcuda.so."+v), Capability: Compute},
		{Path: "lib64/libnvidia-ml.so." + v, Source: filepath.Join(cur, "libnvidia-ml.so."+v), Capability: Utility},
		{Path: "lib64/libnvidia-pkcs11-openssl3.so." + v, Source: filepath.Join(x64, "libnvidia-pkcs11-openssl3.so."+v), Capability: Compute},
		{Path: "lib64/libnvidia-ptxjitcompiler.so." + v, Source: filepath.Join(cur, "libnvidia-ptxjitcompiler.so."+v), Capability: Compute},
	}
	allLinks := []Link{
		{"lib/libcuda.so", "libcuda.so.1"},
		{"lib/libcuda.so.1", "libcuda.so." + v},
		{"lib64/libGL.so.1", "libGL.so.1.7.0"},
		{"lib64/libGLX_nvidia.so.0", "libGLX_nvidia.so." + v},
		{"lib64/libcuda.so", "libcuda.so.1"},
		{"lib64/libcuda.so.1", "libcuda.so." + v},
		{"lib64/libnvidia-ml.so.1", "libnvidia-ml.so." + v},
		{"lib64/libnvidia-ptxjitcompiler.so.1", "libnvidia-ptxjitcompiler.so." + v},
	}
	tests := []struct {
		name      string
		caps      []Capability
		files     Files
		links     []Link
		warnings  []string // substrings, one warning each
		errTarget error
	}{
		{
			name:  "all",
			caps:  AllCapabilities(),
			files: all,
			links: allLinks,
			warnings: []string{
				`libnvidia-cfg.so.1: /usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-cfg.so.470.1 is not of driver ` + v,
				`"libnvidia-nvvm.so/../../x" rejected`,
				`libnvidia-encode.so.1: resolve /lib/x86_64-linux-gnu/libnvidia-encode.so.1: escapes the driver root`,
				`/usr/bin/nvidia-cuda-mps-control: /usr/bin/nvidia-cuda-mps-control is not an executable file`,
			},
		},
		{
			name:  "utility",
			caps:  []Capability{Utility},
			files: Files{all[0], all[5]},
			links: []Link{allLinks[6]},
			warnings: []string{
				`libnvidia-cfg.so.1: /usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-cfg.so.470.1 is not of driver ` + v,
			},
		},
		{
			name:  "compute without compat32",
			caps:  []Capability{Compute},
			files: Files{all[4], all[6], all[7]},
			links: []Link{allLinks[4], allLinks[5], allLinks[7]},
			warnings: []string{
				`"libnvidia-nvvm.so/../../x" rejected`,
				`/usr/bin/nvidia-cuda-mps-control: /usr/bin/nvidia-cuda-mps-control is not an executable file`,
			},
		},
		{
			name:      "display alone has nothing",
			caps:      []Capability{Display},
			errTarget: ErrNoDriver,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := tr.manager(WithCapabilities(tt.caps...))
			c, err := m.Contents(context.Background(), v)
			if tt.errTarget != nil {
				if !errors.Is(err, tt.errTarget) {
					t.Fatalf("Contents = %v, want %v", err, tt.errTarget)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(Files(c.Files), tt.files) {
				t.Errorf("files:\n%v\nwant\n%v", Files(c.Files), tt.files)
			}
			if !reflect.DeepEqual(c.Links, tt.links) {
				t.Errorf("links:\n%v\nwant\n%v", c.Links, tt.links)
			}
			if len(c.Warnings) != len(tt.warnings) {
				t.Errorf("warnings:\n%s\nwant %d", strings.Join(c.Warnings, "\n"), len(tt.warnings))
			}
			for _, w := range tt.warnings {
				if !slices.ContainsFunc(c.Warnings, func(s string) bool { return strings.Contains(s, w) }) {
					t.Errorf("no warning %q among\n%s", w, strings.Join(c.Warnings, "\n"))
				}
			}
		})
	}
}

// Files prints one file a line in failure messages.
type Files []File

func (fs Files) String() string {
	var b strings.Builder
	for _, f := range fs {
		b.WriteString(f.Path + " <- " + f.Source + " (" + string(f.Capability) + ")\n")
	}
	return b.String()
}

func TestContentsInvalidVersion(t *testing.T) {
	m := newTree(t).manager()
	for _, v := range []string{"", "../535", "535/1", "535.a", "535..1", strings.Repeat("1", 40)} {
		if _, err := m.Contents(context.Background(), v); !errors.Is(err, ErrInvalidVersion) {
			t.Errorf("Contents(%q) = %v, want ErrInvalidVersion", v, err)
		}
	}
}

func TestResolve(t *testing.T) {
	tr := newTree(t)
	tr.file("usr/lib/real.so", nil, 0o644)
	tr.symlink("etc/alternatives/a", "/usr/lib/real.so")
	tr.symlink("usr/lib/x86_64-linux-gnu/chain.so", "/etc/alternatives/a")
	tr.symlink("usr/lib/x86_64-linux-gnu/up.so", "../../../../../../../../usr/lib/real.so")
	tr.symlink("usr/lib/x86_64-linux-gnu/loop.so", "loop.so")
	tests := []struct {
		name, path, want string
		fail             bool
	}{
		{"plain", "/usr/lib/real.so", "/usr/lib/real.so", false},
		{"merged usr and alternatives", "/lib/x86_64-linux-gnu/chain.so", "/usr/lib/real.so", false},
		{"dot-dot above the root escapes it", "/lib/x86_64-linux-gnu/up.so", "", true},
		{"loop", "/lib/x86_64-linux-gnu/loop.so", "", true},
		{"missing", "/usr/lib/none.so", "", true},
		{"relative", "usr/lib/real.so", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := resolve(tr.root, tt.path)
			if (err != nil) != tt.fail || got != tt.want {
				t.Fatalf("resolve(%s) = %q, %v; want %q (fail %v)", tt.path, got, err, tt.want, tt.fail)
			}
		})
	}
}

func TestContentsVersionMismatch(t *testing.T) {
	m := driverTree(t, "535.309.01").manager()
	_, err := m.Contents(context.Background(), "999.1.1")
	var me *VersionMismatchError
	if !errors.Is(err, ErrVersionMismatch) || !errors.As(err, &me) || !slices.Contains(me.Found, "535.309.01") {
		t.Fatalf("Contents(999.1.1) = %v, want a mismatch naming 535.309.01", err)
	}
}
