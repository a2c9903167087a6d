package vmtest

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestArchive writes an initramfs and reads it back as the kernel's newc
// parser does: every entry with its type, mode, contents or target and
// device numbers, in order, directories before what they hold.
func TestArchive(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "alternatives"), 0o755)
	os.WriteFile(filepath.Join(src, "passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644)
	os.Symlink("/usr/lib/x", filepath.Join(src, "alternatives", "lib"))
	a := &Archive{}
	for _, err := range []error{
		a.Dir("/bin", 0o755),
		a.File("/bin/busybox", 0o755, []byte("elf")),
		a.Symlink("/bin/sh", "busybox"),
		a.CharDevice("/dev/console", 0o600, 5, 1),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := a.File("/bin/busybox", 0o755, nil); err == nil {
		t.Error("a second /bin/busybox was accepted")
	}
	if err := a.File("bin/../x", 0o644, nil); err == nil {
		t.Error("an unclean path was accepted")
	}
	if _, err := a.AddTree(src, "/etc"); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	n, err := a.WriteTo(&buf)
	if err != nil || n != int64(buf.Len()) || n%4 != 0 {
		t.Fatalf("WriteTo: %d bytes, %v (buffer %d)", n, err, buf.Len())
	}
	got := readArchive(t, buf.Bytes())
	for name, want := range map[string]entry{
		"bin":                  {mode: modeDir | 0o755},
		"bin/busybox":          {mode: modeFile | 0o755, data: []byte("elf")},
		"bin/sh":               {mode: modeSymlink | 0o777, data: []byte("busybox")},
		"dev/console":          {mode: modeChar | 0o600, major: 5, minor: 1},
		"etc":                  {mode: modeDir | 0o755},
		"etc/passwd":           {mode: modeFile | 0o644, data: []byte("root:x:0:0::/root:/bin/sh\n")},
		"etc/alternatives/lib": {mode: modeSymlink | 0o777, data: []byte("/usr/lib/x")},
	} {
		e, ok := got[name]
		if !ok || e.mode != want.mode || !bytes.Equal(e.data, want.data) || e.major != want.major || e.minor != want.minor {
			t.Errorf("%s: %+v (%v), want %+v", name, e, ok, want)
		}
	}
	if len(got) != 8 { // and etc/alternatives
		t.Errorf("%d entries, want 8: %v", len(got), got)
	}
}

func TestLoadOrder(t *testing.T) {
	mods := map[string]Module{
		"9p":           {Name: "9p", Depends: []string{"9pnet", "netfs"}},
		"9pnet":        {Name: "9pnet"},
		"9pnet_virtio": {Name: "9pnet_virtio", Depends: []string{"virtio", "9pnet", "virtio_ring"}},
		"virtio":       {Name: "virtio", Depends: []string{"virtio_ring"}},
		"virtio_ring":  {Name: "virtio_ring"},
		"netfs":        {Name: "netfs"},
		"loop_a":       {Name: "loop_a", Depends: []string{"loop_b"}},
		"loop_b":       {Name: "loop_b", Depends: []string{"loop_a"}},
		"needs_gone":   {Name: "needs_gone", Depends: []string{"gone"}},
	}
	order, err := LoadOrder(mods, map[string]bool{"crc32c": true}, "9pnet_virtio", "9p", "crc32c")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range order {
		names = append(names, m.Name)
	}
	if want := []string{"virtio_ring", "virtio", "9pnet", "9pnet_virtio", "netfs", "9p"}; !slices.Equal(names, want) {
		t.Errorf("order %v, want %v", names, want)
	}
	for _, want := range []string{"loop_a", "needs_gone", "nothing"} {
		if _, err := LoadOrder(mods, nil, want); err == nil {
			t.Errorf("LoadOrder(%s) accepted", want)
		}
	}
}

// TestModinfo reads a module's dependencies from its .modinfo strings.
func TestModinfo(t *testing.T) {
	ko := []byte("\x7fELF...\x00license=GPL\x00depends=virtio,9pnet,virtio_ring\x00name=9pnet_virtio\x00")
	if got := modinfo(ko, "depends"); !slices.Equal(got, []string{"virtio", "9pnet", "virtio_ring"}) {
		t.Errorf("depends = %v", got)
	}
	if got := modinfo([]byte("\x00depends=\x00"), "depends"); got != nil {
		t.Errorf("empty depends = %v", got)
	}
}

// TestMachineArgs: vCPUs and memory spread evenly over the NUMA nodes,
// shares read-only where asked, and the layouts qemu cannot make refused.
func TestMachineArgs(t *testing.T) {
	m := Machine{Kernel: "/k", Initrd: "/i", Cmdline: []string{"a", "b"}, CPUs: 4, NUMANodes: 2, MemoryMiB: 2048,
		Shares: []Share{{Tag: "usr", Path: "/usr", ReadOnly: true}, {Tag: "out", Path: "/o"}}}
	args, err := m.Args()
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(args, " ")
	for _, want := range []string{
		"-smp 4", "-m 2048M", "-append a b", "-accel tcg",
		"-object memory-backend-ram,id=mem0,size=1024M -numa node,nodeid=0,cpus=0-1,memdev=mem0",
		"-object memory-backend-ram,id=mem1,size=1024M -numa node,nodeid=1,cpus=2-3,memdev=mem1",
		"-virtfs local,path=/usr,mount_tag=usr,security_model=none,multidevs=remap,readonly=on",
		"-virtfs local,path=/o,mount_tag=out,security_model=none,multidevs=remap -",
	} {
		if !strings.Contains(joined+" -", want) {
			t.Errorf("args lack %q:\n%s", want, joined)
		}
	}
	for name, bad := range map[string]Machine{
		"no kernel":        {Initrd: "/i", CPUs: 1, NUMANodes: 1, MemoryMiB: 1},
		"a node no CPU":    {Kernel: "/k", Initrd: "/i", CPUs: 1, NUMANodes: 2, MemoryMiB: 2},
		"uneven memory":    {Kernel: "/k", Initrd: "/i", CPUs: 2, NUMANodes: 2, MemoryMiB: 3},
		"a comma in share": {Kernel: "/k", Initrd: "/i", CPUs: 1, NUMANodes: 1, MemoryMiB: 1, Shares: []Share{{Tag: "x", Path: "/a,b"}}},
	} {
		if _, err := bad.Args(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestGuestEnv: the guest's settings are shell assignments that survive
// any value; a bad key or share is refused.
func TestGuestEnv(t *testing.T) {
	g := Guest{
		Shares:  []GuestShare{{Share: Share{Tag: "src", ReadOnly: true}, Dir: "/src"}, {Share: Share{Tag: "out"}, Dir: "/out"}},
		Path:    []string{"/usr/bin", "/bin"},
		Command: `echo "it's $HOME"`,
		Env:     []string{"A=x y"},
	}
	b, err := g.env()
	if err != nil {
		t.Fatal(err)
	}
	want := `export VMTEST_USR=''
export VMTEST_HIDE=''
export VMTEST_SHARES='src:/src:ro out:/out:rw'
export VMTEST_PATH='/usr/bin:/bin'
export VMTEST_DIR=''
export VMTEST_COMMAND='echo "it'\''s $HOME"'
export A='x y'
`
	if string(b) != want {
		t.Errorf("env:\n%s\nwant:\n%s", b, want)
	}
	for _, bad := range []Guest{
		{Env: []string{"A B=1"}},
		{Env: []string{"noequals"}},
		{Shares: []GuestShare{{Share: Share{Tag: "a:b"}, Dir: "/x"}}},
		{Shares: []GuestShare{{Share: Share{Tag: "a"}, Dir: "rel"}}},
		{Usr: []string{"../etc"}},
		{Usr: []string{"/bin"}},
	} {
		if _, err := bad.env(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
