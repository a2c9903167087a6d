package main

import (
	"fmt"
	"os"
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
