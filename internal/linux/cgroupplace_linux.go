package linux

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// CgroupHierarchies lists the cgroup hierarchies mounted at root (the
// host's /sys/fs/cgroup, or where a container mounts the host's): root
// itself when it is a cgroup2 file system (a host of cgroup v2 alone),
// else every directory of root that is a cgroup file system of its own:
// each v1 hierarchy and, on a hybrid host, the unified one. Links (cpu ->
// cpu,cpuacct) are skipped. A root with none is ErrNotSupported.
func CgroupHierarchies(root string) ([]CgroupHierarchy, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return nil, &fs.PathError{Op: "statfs", Path: root, Err: err}
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return []CgroupHierarchy{{Dir: root, V2: true}}, nil
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var out []CgroupHierarchy
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(root, e.Name())
		if err := unix.Statfs(dir, &st); err != nil {
			continue
		}
		switch st.Type {
		case unix.CGROUP2_SUPER_MAGIC:
			out = append(out, CgroupHierarchy{Dir: dir, V2: true})
		case unix.CGROUP_SUPER_MAGIC:
			out = append(out, CgroupHierarchy{Dir: dir, Controllers: e.Name()})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no cgroup hierarchy mounted at %s: %w", root, ErrNotSupported)
	}
	return out, nil
}

// MakeCgroup makes the cgroup p (absolute and clean) in every hierarchy
// of hs, with its missing ancestors; one that exists is kept. In a v1
// cpuset hierarchy each cgroup it makes gets its parent's cpus and mems:
// a new one has none and takes no process.
func MakeCgroup(hs []CgroupHierarchy, p string) error {
	if err := CheckCgroupPath(p); err != nil {
		return err
	}
	var errs []error
	for _, h := range hs {
		if err := makeCgroup(h, p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func makeCgroup(h CgroupHierarchy, p string) error {
	dir := h.Dir
	cpuset := !h.V2 && fileExists(filepath.Join(h.Dir, "cpuset.cpus"))
	for _, c := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		parent := dir
		dir = filepath.Join(dir, c)
		err := os.Mkdir(dir, 0o755)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return err
		}
		if cpuset {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(parent, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, f), b, 0); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// MoveToCgroup moves the process pid into the cgroup p of every hierarchy
// of hs, which MakeCgroup made. With nsFile set (a cgroup namespace, such
// as /proc/1/ns/cgroup of a container that shares the host's pid
// namespace), the moves are made from a thread that joined that namespace
// first, when it is not the caller's own: cgroup v2 mounted with
// nsdelegate (as systemd mounts it) lets a process move another only
// between cgroups its own namespace reaches, and a container's namespace
// of its own reaches only its container's cgroup.
func MoveToCgroup(hs []CgroupHierarchy, p string, pid int, nsFile string) error {
	if err := CheckCgroupPath(p); err != nil {
		return err
	}
	if pid <= 0 {
		return fmt.Errorf("move pid %d: %w", pid, fs.ErrNotExist)
	}
	move := func() error {
		var errs []error
		for _, h := range hs {
			f := filepath.Join(h.Dir, p, "cgroup.procs")
			if err := os.WriteFile(f, []byte(strconv.Itoa(pid)), 0); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	return inCgroupNamespace(nsFile, move)
}

// inCgroupNamespace runs fn in the cgroup namespace nsFile: on a spare
// thread that joins it (and then ends), or on the caller's when nsFile is
// "" or the caller's own namespace.
func inCgroupNamespace(nsFile string, fn func() error) error {
	if nsFile == "" {
		return fn()
	}
	var want, have unix.Stat_t
	if err := unix.Stat(nsFile, &want); err != nil {
		return &fs.PathError{Op: "stat", Path: nsFile, Err: err}
	}
	if err := unix.Stat("/proc/thread-self/ns/cgroup", &have); err == nil && have.Ino == want.Ino && have.Dev == want.Dev {
		return fn()
	}
	return onSpareThread(func() (bool, error) {
		fd, err := unix.Open(nsFile, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return false, &fs.PathError{Op: "open", Path: nsFile, Err: err}
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWCGROUP); err != nil {
			return false, &fs.PathError{Op: "join cgroup namespace", Path: nsFile, Err: err}
		}
		return true, fn()
	})
}

// OwnCgroups reads the calling thread's cgroups (ProcCgroups) as the
// cgroup namespace nsFile shows them ("" for the caller's own): with a
// container's namespace of its own, the namespace of the host's init
// shows the paths as the host names them.
func OwnCgroups(nsFile string) (map[string]string, error) {
	var out map[string]string
	err := inCgroupNamespace(nsFile, func() error {
		b, err := os.ReadFile("/proc/thread-self/cgroup")
		if err != nil {
			return err
		}
		out, err = ProcCgroups(b)
		return err
	})
	return out, err
}

// CgroupProcesses lists the processes in the cgroup p of h (its
// cgroup.procs, as the caller's pid namespace numbers them).
func CgroupProcesses(h CgroupHierarchy, p string) ([]int, error) {
	if err := CheckCgroupPath(p); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(h.Dir, p, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}

// RemoveCgroup removes the cgroup p from every hierarchy of hs (not its
// ancestors); one that is not there is not an error, one that holds a
// process or a cgroup is. A cgroup whose last process has just ended may still count
// as busy for a moment: its removal is retried for up to a second.
func RemoveCgroup(hs []CgroupHierarchy, p string) error {
	if err := CheckCgroupPath(p); err != nil {
		return err
	}
	if p == "/" {
		return fmt.Errorf("remove the root cgroup: %w", ErrCgroupPath)
	}
	var errs []error
	for _, h := range hs {
		dir := filepath.Join(h.Dir, p)
		wait := time.Millisecond
		for deadline := time.Now().Add(time.Second); ; {
			err := unix.Rmdir(dir)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) || inUse(h, p) {
				errs = append(errs, &fs.PathError{Op: "rmdir", Path: dir, Err: err})
				break
			}
			time.Sleep(wait)
			wait = min(2*wait, 50*time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

// inUse reports whether the cgroup p of h holds a process or a cgroup.
func inUse(h CgroupHierarchy, p string) bool {
	if pids, _ := CgroupProcesses(h, p); len(pids) > 0 {
		return true
	}
	entries, _ := os.ReadDir(filepath.Join(h.Dir, p))
	for _, e := range entries {
		if e.IsDir() {
			return true
		}
	}
	return false
}
