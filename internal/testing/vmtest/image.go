package vmtest

import (
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

//go:embed init.sh
var initScript []byte

// Modules the guest loads (with their dependencies): the virtio console
// that carries its output, and 9p over virtio for the shares. The rest of
// what the suites need (cgroup2, eBPF, namespaces, tmpfs, NUMA) is built
// into Debian's kernel.
var guestModules = []string{"virtio_pci", "virtio_console", "9pnet_virtio", "9p"}

// Kernel is what the provisioned cache (.ci/vm-kernel.sh) holds.
type Kernel struct {
	Dir     string // the cache directory
	Release string // the kernel's version, "6.1.0-56-amd64"
}

// DefaultKernelDir is where .ci/vm-kernel.sh caches the kernel.
const DefaultKernelDir = "/var/cache/gpuiso/vm"

// FindKernel reads the cache in dir; a missing or incomplete one is an
// error that names the script that fills it.
func FindKernel(dir string) (Kernel, error) {
	b, err := os.ReadFile(filepath.Join(dir, "release"))
	if err != nil {
		return Kernel{}, fmt.Errorf("no VM kernel cached in %s (bash .ci/vm-kernel.sh fetches it): %w", dir, err)
	}
	k := Kernel{Dir: dir, Release: strings.TrimSpace(string(b))}
	for _, f := range []string{k.Vmlinux(), k.Busybox(), k.ModulesDir()} {
		if _, err := os.Stat(f); err != nil {
			return Kernel{}, fmt.Errorf("VM kernel cache %s is incomplete (bash .ci/vm-kernel.sh fetches it again): %w", dir, err)
		}
	}
	return k, nil
}

func (k Kernel) Vmlinux() string    { return filepath.Join(k.Dir, "vmlinux") }
func (k Kernel) Busybox() string    { return filepath.Join(k.Dir, "busybox") }
func (k Kernel) ModulesDir() string { return filepath.Join(k.Dir, "modules") }

// Cmdline is the kernel command line of a cgroup2-only guest: no v1
// controller at all, the unified hierarchy as systemd hosts have it, the
// kernel's log on the first serial port, and a power-off rather than a
// hang on panic (qemu runs with -no-reboot).
func Cmdline() []string {
	return []string{"console=ttyS0", "loglevel=4", "cgroup_no_v1=all", "systemd.unified_cgroup_hierarchy=1", "panic=-1", "rdinit=/init"}
}

// Guest is what the initramfs gives the guest beside the init: the shares
// it mounts, its PATH and environment, and the command it runs.
type Guest struct {
	// Usr lists the directories of the host's /usr the guest's /usr holds
	// ("bin", "lib/x86_64-linux-gnu"; those the host lacks are left out),
	// bound read-only from the host's /usr, which is always shared (tag
	// "usr"). The rest of /usr is not there.
	Usr []string
	// Hide lists files of those directories ("bin/podman") the guest must
	// not run: each is covered with /dev/null, which no PATH lookup takes
	// for a program.
	Hide []string
	// Shares are mounted read-only (or read-write) at their Dir.
	Shares []GuestShare
	// Path is the guest's PATH.
	Path []string
	// Dir is the directory the command starts in.
	Dir string
	// Env are more "KEY=value" settings for the command.
	Env []string
	// Command is run with sh -c; the guest powers off when it ends.
	Command string
}

// GuestUsr is what the suites need of the host's /usr: its programs, the
// loader and the libraries (NVIDIA's user-space driver, under Debian's
// alternatives, included). Not /usr/share, /usr/local (Go is not there
// for the guest) or other languages' trees.
func GuestUsr() []string {
	return []string{"bin", "sbin", "lib64", "libexec", "lib/x86_64-linux-gnu", "lib/nvidia"}
}

// GuestHidden are the host's container engines, which the guest does not
// run: their suites run on the host, and under TCG a daemon's start alone
// takes most of the VM step's budget. gpuiso-runtime runs under the
// bundle's runc.
func GuestHidden() []string {
	return []string{"bin/docker", "sbin/dockerd", "bin/dockerd", "bin/containerd", "bin/ctr", "bin/containerd-shim-runc-v2", "bin/podman", "bin/crun"}
}

// GuestShare is a 9p share as the guest mounts it.
type GuestShare struct {
	Share
	Dir string // where in the guest
}

// Initramfs assembles the guest's initramfs: busybox, the init (see
// init.sh), the modules it loads and their order, a copy of the host's
// etcDir as the guest's /etc, and the guest's settings (/vm.env).
func Initramfs(k Kernel, etcDir string, g Guest) (*Archive, []string, error) {
	a := &Archive{}
	for _, d := range []string{"/bin", "/dev", "/proc", "/sys", "/modules", "/newroot"} {
		if err := a.Dir(d, 0o755); err != nil {
			return nil, nil, err
		}
	}
	if err := a.CharDevice("/dev/console", 0o600, 5, 1); err != nil {
		return nil, nil, err
	}
	bb, err := os.ReadFile(k.Busybox())
	if err != nil {
		return nil, nil, err
	}
	if err := a.File("/bin/busybox", 0o755, bb); err != nil {
		return nil, nil, err
	}
	if err := a.Symlink("/bin/sh", "busybox"); err != nil {
		return nil, nil, err
	}
	if err := a.File("/init", 0o755, initScript); err != nil {
		return nil, nil, err
	}
	mods, err := Modules(k.ModulesDir())
	if err != nil {
		return nil, nil, err
	}
	builtin, err := Builtin(k.ModulesDir())
	if err != nil {
		return nil, nil, err
	}
	order, err := LoadOrder(mods, builtin, guestModules...)
	if err != nil {
		return nil, nil, err
	}
	var names []string
	for _, m := range order {
		b, err := os.ReadFile(m.Path)
		if err != nil {
			return nil, nil, err
		}
		if err := a.File("/modules/"+m.Name+".ko", 0o644, b); err != nil {
			return nil, nil, err
		}
		names = append(names, m.Name)
	}
	if err := a.File("/modules.order", 0o644, []byte(strings.Join(names, "\n")+"\n")); err != nil {
		return nil, nil, err
	}
	skipped, err := a.AddTree(etcDir, "/etc")
	if err != nil {
		return nil, nil, err
	}
	env, err := g.env()
	if err != nil {
		return nil, nil, err
	}
	if err := a.File("/vm.env", 0o644, env); err != nil {
		return nil, nil, err
	}
	return a, skipped, nil
}

// env renders g as the shell assignments /vm.env holds.
func (g Guest) env() ([]byte, error) {
	var shares []string
	for _, s := range g.Shares {
		if strings.ContainsAny(s.Tag+s.Dir, ": \t\n'") || !filepath.IsAbs(s.Dir) {
			return nil, fmt.Errorf("vm: share %q at %q: want a tag and an absolute directory without ':', quotes or spaces", s.Tag, s.Dir)
		}
		mode := "rw"
		if s.ReadOnly {
			mode = "ro"
		}
		shares = append(shares, s.Tag+":"+s.Dir+":"+mode)
	}
	for _, d := range append(slices.Clone(g.Usr), g.Hide...) {
		if d == "" || strings.ContainsAny(d, " \t\n'") || filepath.IsAbs(d) || filepath.Clean(d) != d || strings.HasPrefix(d, "..") {
			return nil, fmt.Errorf("vm: /usr directory %q: want a clean relative path without spaces or quotes", d)
		}
	}
	vars := [][2]string{
		{"VMTEST_USR", strings.Join(g.Usr, " ")},
		{"VMTEST_HIDE", strings.Join(g.Hide, " ")},
		{"VMTEST_SHARES", strings.Join(shares, " ")},
		{"VMTEST_PATH", strings.Join(g.Path, ":")},
		{"VMTEST_DIR", g.Dir},
		{"VMTEST_COMMAND", g.Command},
	}
	for _, kv := range g.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.Trim(k, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_") != "" {
			return nil, fmt.Errorf("vm: environment entry %q: want KEY=value", kv)
		}
		vars = append(vars, [2]string{k, v})
	}
	var b strings.Builder
	for _, kv := range vars {
		fmt.Fprintf(&b, "export %s=%s\n", kv[0], shellQuote(kv[1]))
	}
	return []byte(b.String()), nil
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// MachineShares lists the machine's 9p shares for g: the host's /usr, then g's.
func (g Guest) MachineShares() []Share {
	out := []Share{{Tag: "usr", Path: "/usr", ReadOnly: true}}
	for _, s := range g.Shares {
		out = append(out, s.Share)
	}
	return slices.Clip(out)
}
