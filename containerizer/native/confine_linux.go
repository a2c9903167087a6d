package native

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// initCloneFlags are the namespaces a container's init is born in: its own
// mount, pid, IPC and UTS namespaces, and its own network namespace unless
// the spec asks for the host's (see start). The cgroup namespace comes
// later, once the init is in its cgroup (see startContainer).
const initCloneFlags = linux.CloneNewNS | linux.CloneNewPID | linux.CloneNewIPC | linux.CloneNewUTS

// startContainer sets up the container's file system and starts its command
// confined. It runs on a thread of its own, locked and never unlocked: the
// cgroup namespace, capability sets, no_new_privs bit and seccomp filter it
// takes on belong to that thread alone, which forks the command (so the
// command inherits them) and then ends. The rest of the init keeps its
// privileges to wait for the command and record its exit status. On error
// it returns the init's exit code for it.
func startContainer(cfg initConfig) (*exec.Cmd, int, error) {
	type result struct {
		cmd  *exec.Cmd
		code int
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		cmd, code, err := confineAndStart(cfg)
		ch <- result{cmd, code, err}
	}()
	r := <-ch
	return r.cmd, r.code, r.err
}

func confineAndStart(cfg initConfig) (*exec.Cmd, int, error) {
	if cfg.Bare {
		return startBare(cfg)
	}
	cf := cfg.Confine
	if len(cf.Seccomp) == 0 {
		return nil, exitInitFailed, errors.New("no seccomp program in the init's config")
	}
	if err := setupFS(cfg); err != nil {
		return nil, exitInitFailed, err
	}
	path, err := lookPath(cfg.Args[0], cfg.Env)
	if err != nil {
		return nil, exitNotFound, err
	}
	cmd := exec.Command(path, cfg.Args[1:]...)
	cmd.Args[0] = cfg.Args[0]
	cmd.Env, cmd.Dir = cfg.Env, cfg.Dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = extraFiles(cfg.ExtraFiles)
	if cf.User != nil {
		// Leaving uid 0 clears the permitted and effective sets: the
		// command has no capabilities, as in Docker.
		cmd.SysProcAttr = linux.UserAttr(cf.User.UID, cf.User.GID)
	}
	if err := linux.SetNoNewPrivs(); err != nil {
		return nil, exitInitFailed, err
	}
	if err := linux.LimitCapabilities(cf.Caps); err != nil {
		return nil, exitInitFailed, err
	}
	if err := linux.LoadSeccomp(cf.Seccomp); err != nil { // this thread only: no TSYNC
		return nil, exitInitFailed, err
	}
	if err := cmd.Start(); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, exitNotFound, err // a path naming nothing
		}
		return nil, exitNotRunnable, err
	}
	return cmd, 0, nil
}

// extraFiles are the n descriptors the init got after its config's: the
// spec's ExtraFiles, for the command.
func extraFiles(n int) []*os.File {
	files := make([]*os.File, n)
	for i := range files {
		files[i] = os.NewFile(uintptr(4+i), fmt.Sprintf("extra-%d", i))
	}
	return files
}

// setupFS runs in the container's new mount namespace (nothing it mounts
// reaches the host's) on the locked thread: the network and host name of
// its own namespaces, private /dev and /tmp, the plan's mounts, a /proc of
// the container's pid namespace with Docker's masked and read-only paths,
// a read-only /sys with the cgroup file systems of a new cgroup namespace,
// read-only, and, with a root file system, pivot_root.
func setupFS(cfg initConfig) error {
	if !cfg.Confine.HostNetwork {
		if err := linux.LoopbackUp(); err != nil {
			return err
		}
	}
	if cfg.Confine.Hostname != "" {
		if err := linux.SetHostname(cfg.Confine.Hostname); err != nil {
			return err
		}
	}
	cgroups := hostCgroups() // before /sys is covered
	if err := linux.MakeRSlave("/"); err != nil {
		return err
	}
	root := "/"
	switch {
	case cfg.Confine.RootFS != "":
		root = cfg.Confine.RootFS
		if err := linux.BindMount(root, root, false); err != nil { // a mount point to pivot into
			return err
		}
	case cfg.Confine.HostRoot != "":
		root = cfg.Confine.HostRoot
		if err := hostRootReadOnly(root); err != nil {
			return err
		}
	}
	// Every path below is resolved inside root: an image's links never
	// lead a mount point out of it. /dev, /proc and /sys, reached by plain
	// paths afterwards, must be directories of the root itself.
	r, err := linux.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	at := func(p string) string { return filepath.Join(root, p) }
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		if err := r.Dir(d); err != nil {
			return err
		}
	}
	if err := linux.BindMount(cfg.DevDir, at("/dev"), false); err != nil {
		return err
	}
	if err := linux.MountDevpts(at("/dev/pts")); err != nil {
		return err
	}
	if err := linux.MountSizedTmpfs(at("/dev/shm"), 0o777|os.ModeSticky, shmBytes, 0); err != nil {
		return err
	}
	if err := r.Tmpfs("/tmp", 0o777|os.ModeSticky); err != nil {
		return err
	}
	if cfg.Confine.HostRoot != "" {
		if err := hideHostState(r, at, cfg.Dir); err != nil {
			return err
		}
	}
	for _, m := range cfg.Mounts {
		if err := r.BindWith(m.Source, m.Destination, linux.ParseBindOptions(m.Options)); err != nil {
			return fmt.Errorf("mount %s: %w", m.Destination, err)
		}
	}
	if err := linux.MountProc(at("/proc")); err != nil {
		return err
	}
	if err := keepDeviceNodes(at("/proc"), filepath.Join(filepath.Dir(cfg.DevDir), driverParamsCopy)); err != nil {
		return err
	}
	if err := linux.MountSysfs(at("/sys")); err != nil {
		return err
	}
	if err := linux.UnshareCgroup(); err != nil {
		return err
	}
	if err := mountCgroups(at("/sys/fs/cgroup"), cgroups); err != nil {
		return err
	}
	for _, p := range maskedPaths() {
		if err := linux.MaskPath(at(p), at("/dev/null")); err != nil {
			return err
		}
	}
	for _, p := range readOnlyPaths() {
		if _, err := os.Stat(at(p)); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := linux.BindMount(at(p), at(p), true); err != nil {
			return err
		}
	}
	if cfg.Confine.HostRoot != "" {
		// The containerizer's state (every container's record and /dev)
		// is none of the container's business.
		if err := linux.MaskPath(at(filepath.Dir(filepath.Dir(cfg.DevDir))), at("/dev/null")); err != nil {
			return err
		}
		for _, p := range cfg.Masked {
			if err := linux.MaskPath(at(p), at("/dev/null")); err != nil {
				return err
			}
		}
	}
	if root != "/" {
		return linux.PivotRoot(root)
	}
	return nil
}

// hideHostState covers, in a container's read-only view of the host, what
// must not be reached at all: the host's runtime directories get a private
// tmpfs each (no host socket left in them), the container engines' state
// directories are masked. dir, the container's working directory, is then
// shared writable with the host, nosuid and nodev, unless it lies in one of
// the private directories (it is then the container's own, empty).
func hideHostState(r *linux.Root, at func(string) string, dir string) error {
	for _, p := range privateDirs() {
		fi, err := os.Lstat(at(p))
		if err != nil || !fi.IsDir() {
			continue // absent, or a link to another (/var/run -> /run)
		}
		if err := r.Tmpfs(p, 0o755|dirSticky(p)); err != nil {
			return err
		}
	}
	for _, p := range engineDirs() {
		if err := linux.MaskPath(at(p), at("/dev/null")); err != nil {
			return err
		}
	}
	if dir == "" || dir == "/" {
		return nil
	}
	for _, p := range append(privateDirs(), engineDirs()...) {
		if dir == p || strings.HasPrefix(dir, p+"/") {
			return os.MkdirAll(at(dir), 0o755) // the container's own, in its private tmpfs
		}
	}
	if _, err := os.Stat(dir); err != nil {
		return nil // nothing of the host's to share
	}
	return linux.BindMountNoSUID(dir, at(dir))
}

// dirSticky is the sticky bit for /tmp and /var/tmp, the private
// directories every user may write to.
func dirSticky(p string) os.FileMode {
	if p == "/tmp" || p == "/var/tmp" {
		return 0o777 | os.ModeSticky
	}
	return 0
}

// hostRootReadOnly binds the host's whole mount tree at root and makes every
// mount of it read-only, as a container's view of the host: the container
// may read the host's programs, libraries and driver, and change none of
// them. /dev, /proc and /sys are mounted afresh over their copies
// afterwards; hideHostState covers what it must not reach at all.
func hostRootReadOnly(root string) error {
	// One clone of the whole tree, made read-only before it is attached:
	// the cost does not grow with the host's mounts.
	err := linux.BindTreeReadOnly("/", root)
	if !errors.Is(err, linux.ErrNotSupported) {
		return err
	}
	// Older kernels: bind, then remount each mount of the copy.
	if err := linux.BindMount("/", root, false); err != nil {
		return err
	}
	// The copy takes no mount events from the host any more: a mount made
	// on the host later must not appear writable in it, and one
	// unmounted there must not vanish under the walk below.
	if err := linux.MakeRPrivate(root); err != nil {
		return err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	points, err := linux.ParseMountPoints(f, root)
	f.Close()
	if err != nil {
		return err
	}
	covered := func(p string) bool {
		for _, d := range []string{"/dev", "/proc", "/sys"} {
			if p == filepath.Join(root, d) || strings.HasPrefix(p, filepath.Join(root, d)+"/") {
				return true
			}
		}
		return false
	}
	for _, p := range points {
		if covered(p) {
			continue // hidden under the container's own
		}
		err := linux.RemountReadOnly(p)
		if err != nil && p != root && (errors.Is(err, fs.ErrNotExist) || linux.Invalid(err)) {
			// Gone since the listing: the host removed its mount point
			// (a Docker container's overlay, say), which detaches the copy
			// here too. Nothing of it is left to protect.
			continue
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// cgroupLayout is how the host mounts its cgroup file systems.
type cgroupLayout struct {
	unified bool     // cgroup2 at /sys/fs/cgroup
	cgroup2 bool     // cgroup2 at /sys/fs/cgroup/unified (hybrid)
	v1      []string // v1 hierarchies: names under /sys/fs/cgroup
	links   map[string]string
}

func hostCgroups() cgroupLayout {
	var l cgroupLayout
	if t, err := linux.FilesystemType("/sys/fs/cgroup"); err == nil && t == linux.Cgroup2Magic {
		l.unified = true
		return l
	}
	if t, err := linux.FilesystemType("/sys/fs/cgroup/unified"); err == nil && t == linux.Cgroup2Magic {
		l.cgroup2 = true
	}
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	l.links = map[string]string{}
	for _, e := range entries {
		p := filepath.Join("/sys/fs/cgroup", e.Name())
		if e.Type()&os.ModeSymlink != 0 {
			if target, err := os.Readlink(p); err == nil {
				l.links[e.Name()] = target
			}
			continue
		}
		if t, err := linux.FilesystemType(p); err == nil && t == linux.CgroupMagic {
			l.v1 = append(l.v1, e.Name())
		}
	}
	return l
}

// mountCgroups mounts the host's cgroup hierarchies at dir read-only, as the
// calling thread's cgroup namespace shows them. The devices hierarchy and
// cgroup2 must mount; another v1 hierarchy that does not is left out.
func mountCgroups(dir string, l cgroupLayout) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if l.unified {
		return linux.MountCgroup(dir, "")
	}
	if err := linux.MountTmpfs(dir, 0o755); err != nil {
		return err
	}
	if l.cgroup2 {
		if err := os.Mkdir(filepath.Join(dir, "unified"), 0o555); err != nil {
			return err
		}
		if err := linux.MountCgroup(filepath.Join(dir, "unified"), ""); err != nil {
			return err
		}
	}
	for _, name := range l.v1 {
		p := filepath.Join(dir, name)
		if err := os.Mkdir(p, 0o555); err != nil {
			return err
		}
		opts := name
		if name == "systemd" {
			opts = "none,name=systemd"
		}
		if err := linux.MountCgroup(p, opts); err != nil && name == "devices" {
			return err
		}
	}
	for name, target := range l.links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return linux.RemountReadOnly(dir)
}

// startBare starts the command with nothing set up around it: the
// containerizer's own tests of its bookkeeping, without root.
func startBare(cfg initConfig) (*exec.Cmd, int, error) {
	path, err := lookPath(cfg.Args[0], cfg.Env)
	if err != nil {
		return nil, exitNotFound, err
	}
	cmd := exec.Command(path, cfg.Args[1:]...)
	cmd.Args[0] = cfg.Args[0]
	cmd.Env, cmd.Dir = cfg.Env, cfg.Dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = extraFiles(cfg.ExtraFiles)
	if err := cmd.Start(); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, exitNotFound, err // a path naming nothing
		}
		return nil, exitNotRunnable, err
	}
	return cmd, 0, nil
}
