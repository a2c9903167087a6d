package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// finitModule is finit_module's number, which package syscall lacks on some
// architectures.
var finitModule = map[string]uintptr{"amd64": 313, "arm64": 273}[runtime.GOARCH]

// escape tries, one after the other, what a root process would do to leave
// its container, and prints "<probe> <result>" for each: "ok" when the
// kernel let it, else the errno. args are KEY=VALUE settings:
//
//	gpu=MAJOR:MINOR   a GPU of another container (mknod, then open)
//	other=PATH        a device node in another container's /dev
//	hostpid=PID       a process of the host (ptrace)
//	volume=DIR        the driver volume's mount point ("n/a" without)
//	hostfile=PATH     a file of the host's root file system to create ("n/a" without)
//	sockets=P1,P2     UNIX sockets of the host's daemons (Docker's, containerd's) to connect to
//	tcp=ADDR          a TCP listener on the host's loopback to connect to
//	abstract=NAME     an abstract UNIX socket of the host to connect to
//	fd=N              a directory the caller held open as fd N: create a file through it
//	plant=NAME        a file name to plant in /tmp, for the host to look for afterwards
//	workdir=1         plant it in the working directory too
//	skip=DIR          a directory the walk for sockets leaves out
//
// It also walks the whole file system it sees (but /proc, /sys, /dev and
// skip) and connects to every UNIX socket there ("connect-any-socket"), lists its
// open descriptors ("open-fds"), and tries a setuid file and a device node
// in /tmp and the working directory.
func escape(args []string) {
	set := map[string]string{}
	for _, a := range args {
		k, v, _ := strings.Cut(a, "=")
		set[k] = v
	}
	pid := strconv.Itoa(os.Getpid())
	report := func(name string, err error) { fmt.Println(name, result(err)) }
	report("write-devices-cgroup.procs", appendTo("/sys/fs/cgroup/devices/cgroup.procs", pid))
	report("write-devices.allow", appendTo("/sys/fs/cgroup/devices/devices.allow", "a"))
	report("write-unified-cgroup.procs", appendTo("/sys/fs/cgroup/unified/cgroup.procs", pid))
	// A cgroup2-only host mounts the one hierarchy at /sys/fs/cgroup: leave
	// the container's cgroup for the root, make one, enable a controller.
	// Elsewhere /sys/fs/cgroup is a tmpfs of the container's own.
	var st syscall.Statfs_t
	if syscall.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == 0x63677270 { // CGROUP2_SUPER_MAGIC
		report("write-cgroup2-cgroup.procs", appendTo("/sys/fs/cgroup/cgroup.procs", pid))
		report("mkdir-cgroup2", syscall.Mkdir("/sys/fs/cgroup/escape", 0o755))
		report("write-cgroup2-subtree_control", appendTo("/sys/fs/cgroup/cgroup.subtree_control", "+cpuset"))
	} else {
		for _, k := range []string{"write-cgroup2-cgroup.procs", "mkdir-cgroup2", "write-cgroup2-subtree_control"} {
			fmt.Println(k, "n/a")
		}
	}
	report("mkdir-cgroup", syscall.Mkdir("/sys/fs/cgroup/devices/escape", 0o755))
	report("write-sys", rewrite("/sys/kernel/profiling"))
	report("umount-dev", syscall.Unmount("/dev", syscall.MNT_DETACH))
	report("mount-over-dev", syscall.Mount("tmpfs", "/dev", "tmpfs", 0, ""))
	if v := set["volume"]; v != "" {
		report("remount-volume-rw", syscall.Mount("", v, "", syscall.MS_REMOUNT|syscall.MS_BIND, ""))
		report("write-volume", os.WriteFile(v+"/escape", nil, 0o644))
	} else {
		fmt.Println("remount-volume-rw n/a")
		fmt.Println("write-volume n/a")
	}
	if h := set["hostfile"]; h != "" {
		report("write-host-root", os.WriteFile(h, nil, 0o644))
		report("remount-root-rw", syscall.Mount("", "/", "", syscall.MS_REMOUNT|syscall.MS_BIND, ""))
	} else {
		fmt.Println("write-host-root n/a")
		fmt.Println("remount-root-rw n/a")
	}
	if g := set["gpu"]; g != "" {
		major, minor, _ := strings.Cut(g, ":")
		ma, _ := strconv.Atoi(major)
		mi, _ := strconv.Atoi(minor)
		err := syscall.Mknod("/dev/escape-gpu", syscall.S_IFCHR|0o666, mi&0xff|(ma&0xfff)<<8|(mi&^0xff)<<12)
		if err == nil || os.IsExist(err) {
			err = openRW("/dev/escape-gpu")
		}
		report("mknod-open-other-gpu", err)
	}
	if p := set["other"]; p != "" {
		report("open-other-container-dev", openRW(p))
	}
	if p := set["hostpid"]; p != "" {
		n, _ := strconv.Atoi(p)
		err := syscall.PtraceAttach(n)
		if err == nil {
			syscall.PtraceDetach(n)
		}
		report("ptrace-host-process", err)
	}
	report("init_module", errnoOf(syscall.Syscall(syscall.SYS_INIT_MODULE, 0, 0, 0)))
	if finitModule != 0 {
		report("finit_module", errnoOf(syscall.Syscall(finitModule, ^uintptr(0), 0, 0)))
	}
	report("write-proc-sys", rewrite("/proc/sys/kernel/hostname"))
	for i, p := range strings.Split(set["sockets"], ",") {
		if p != "" {
			report(fmt.Sprintf("connect-host-socket-%d", i), connectUnix(p))
		}
	}
	if a := set["tcp"]; a != "" {
		report("connect-host-loopback", connectTCP(a))
	}
	if a := set["abstract"]; a != "" {
		report("connect-host-abstract", connectUnix("@"+a))
	}
	fmt.Println("connect-any-socket", anySocket(set["skip"]))
	if v := set["fd"]; v != "" {
		n, _ := strconv.Atoi(v)
		fd, err := syscall.Openat(n, "gpuiso-escape-fd", syscall.O_CREAT|syscall.O_WRONLY, 0o644)
		if err == nil {
			syscall.Close(fd)
		}
		report("write-through-inherited-fd", err)
	}
	fmt.Println("open-fds", strings.Join(openFDs(), ","))
	if name := set["plant"]; name != "" {
		dirs := []struct{ probe, path string }{{"tmp", "/tmp"}}
		if set["workdir"] == "1" {
			cwd, _ := os.Getwd()
			dirs = append(dirs, struct{ probe, path string }{"workdir", cwd})
		}
		for _, dir := range dirs {
			report("setuid-in-"+dir.probe, setuidWorks(filepath.Join(dir.path, name)))
			report("device-in-"+dir.probe, deviceWorks(filepath.Join(dir.path, name+"-null")))
		}
	}
	report("unshare-user-mount-ns", syscall.Unshare(syscall.CLONE_NEWUSER|syscall.CLONE_NEWNS))
	fmt.Println("CapEff", status("CapEff"))
	fmt.Println("CapBnd", status("CapBnd"))
	fmt.Println("NoNewPrivs", status("NoNewPrivs"))
	fmt.Println("Seccomp", status("Seccomp"))
	fmt.Println("pids-visible", strings.Join(pids(), ","))
}

func errnoOf(_, _ uintptr, e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func openRW(p string) error {
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err == nil {
		f.Close()
	}
	return err
}

// appendTo writes s to the existing file p.
func appendTo(p, s string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString(s)
	return err
}

// rewrite writes p's own content back to it: harmless where it works.
func rewrite(p string) error {
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	return appendTo(p, string(b))
}

func status(key string) string {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

func pids() []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, e.Name())
		}
	}
	return out
}

func connectUnix(path string) error {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	addr := &syscall.SockaddrUnix{Name: path}
	if strings.HasPrefix(path, "@") {
		addr.Name = "\x00" + path[1:]
	}
	return syscall.Connect(fd, addr)
}

func connectTCP(addr string) error {
	host, port, _ := strings.Cut(addr, ":")
	p, _ := strconv.Atoi(port)
	var ip [4]byte
	for i, b := range strings.SplitN(host, ".", 4) {
		v, _ := strconv.Atoi(b)
		ip[i] = byte(v)
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	return syscall.Connect(fd, &syscall.SockaddrInet4{Port: p, Addr: ip})
}

// anySocket connects to every UNIX socket file it can see: "ok:PATH" for
// the first that answers, "none" when none does.
func anySocket(skip string) string {
	found := "none"
	filepath.WalkDir("/", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && (p == "/proc" || p == "/sys" || p == "/dev" || (skip != "" && p == skip)) {
			return filepath.SkipDir
		}
		if d.Type()&fs.ModeSocket != 0 && connectUnix(p) == nil {
			found = "ok:" + p
			return filepath.SkipAll
		}
		return nil
	})
	return found
}

func openFDs() []string {
	entries, _ := os.ReadDir("/proc/self/fd")
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// setuidWorks writes a setuid-root copy of this program at p and reports
// whether its mount honours the bit: nil ("ok") when it would run setuid.
func setuidWorks(p string) error {
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		return err
	}
	if err := os.WriteFile(p, self, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(p, 0o4755); err != nil {
		return err
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(p, &st); err != nil {
		return err
	}
	if st.Flags&0x2 != 0 { // ST_NOSUID
		return syscall.EPERM
	}
	return nil
}

// deviceWorks makes /dev/null's node at p and opens it: nil ("ok") when
// the mount lets device files work.
func deviceWorks(p string) error {
	if err := syscall.Mknod(p, syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		return err
	}
	return openRW(p)
}
