package testenv

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// LeakSettle is how long CheckLeaks waits, after the tests, for what they
// started to end by itself (a goroutine returning, a child being waited
// for, a file being closed) before it calls what is left a leak.
const LeakSettle = 5 * time.Second

// LeakOption changes what CheckLeaks accepts.
type LeakOption func(*leakConfig)

type leakConfig struct {
	goroutines []string // function names (prefixes) of goroutines that may outlive the tests
	files      []string // link targets (prefixes) of descriptors that may outlive the tests
	settle     time.Duration
}

// IgnoreGoroutines accepts goroutines that have a frame in a function whose
// name starts with one of funcs (such as "k8s.io/klog/v2.(*flushDaemon)"):
// a package's background worker that lives as long as the process.
func IgnoreGoroutines(funcs ...string) LeakOption {
	return func(c *leakConfig) { c.goroutines = append(c.goroutines, funcs...) }
}

// IgnoreFiles accepts open descriptors whose target (as /proc/self/fd
// links name it, such as "socket:[" or "/dev/nvidiactl") starts with one
// of prefixes.
func IgnoreFiles(prefixes ...string) LeakOption {
	return func(c *leakConfig) { c.files = append(c.files, prefixes...) }
}

// defaultIgnoredGoroutines live as long as the process once something
// starts them: signal delivery (os/signal.Notify) and the test framework's
// own.
var defaultIgnoredGoroutines = []string{
	"os/signal.signal_recv",
	"os/signal.loop",
	"runtime.ensureSigM",
	"testing.(*M).",
	"testing.runFuzzing",
}

// privateProc names, among open descriptors, the root of a procfs mount
// of the process's own, which no path reaches (its link reads "/").
const privateProc = "a private procfs mount"

// procMagic is procfs's file system type.
const procMagic = 0x9fa0

// runtimeFiles are descriptors opened once, lazily, and kept for the
// process's life: one of each may appear during the tests. The Go runtime
// opens the first two for its network poller; filepath-securejoin keeps a
// private procfs mount, from which it reads /proc safely.
var runtimeFiles = []string{"anon_inode:[eventpoll]", "anon_inode:[eventfd]", privateProc}

// settleFor replaces LeakSettle.
func settleFor(d time.Duration) LeakOption {
	return func(c *leakConfig) { c.settle = d }
}

// CheckLeaks runs m's tests and then checks that they left nothing behind:
// no descriptor open that was not open before them, no goroutine running
// that was not running before them, and no child process (running or a
// zombie nobody waited for). It gives what the tests started LeakSettle to
// end. It returns m.Run's exit code, or 1 when something leaked, after
// writing each leak to standard error (descriptors with their targets,
// goroutines with their stacks, children with their command lines); it
// kills leaked children, so that the run leaves none behind. Call it from
// TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(testenv.CheckLeaks(m)) }
func CheckLeaks(m *testing.M, opts ...LeakOption) int {
	return checkLeaks(m.Run, os.Stderr, opts...)
}

// checkLeaks is CheckLeaks around run, writing leaks to w.
func checkLeaks(run func() int, w io.Writer, opts ...LeakOption) int {
	c := leakConfig{goroutines: slices.Clone(defaultIgnoredGoroutines), settle: LeakSettle}
	for _, o := range opts {
		o(&c)
	}
	fds, fdErr := openFiles()
	goroutines := goroutineIDs(allGoroutines())
	code := run()
	if fdErr != nil {
		fmt.Fprintf(w, "testenv: cannot check for leaked descriptors: %v\n", fdErr)
	}
	var leaks []string
	for deadline, pause := time.Now().Add(c.settle), 10*time.Millisecond; ; pause = min(2*pause, 250*time.Millisecond) {
		leaks = c.leaks(fds, fdErr == nil, goroutines)
		if len(leaks) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(pause)
	}
	if len(leaks) == 0 {
		return code
	}
	fmt.Fprintf(w, "testenv: the tests leaked (still there %v after they ended):\n", c.settle)
	for _, l := range leaks {
		fmt.Fprintf(w, "%s\n", l)
	}
	for _, p := range children() {
		if p.state != "Z" {
			syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
	fmt.Fprintln(w, "FAIL: leaks")
	return 1
}

// leaks lists what is open, running or alive now that was not before.
func (c *leakConfig) leaks(fdsBefore map[int]string, checkFDs bool, goroutinesBefore map[string]bool) []string {
	var out []string
	if checkFDs {
		now, err := openFiles()
		if err != nil {
			out = append(out, fmt.Sprintf("  cannot list open descriptors: %v", err))
		}
		var fds []int
		for fd := range now {
			fds = append(fds, fd)
		}
		slices.Sort(fds)
		runtimeSeen := map[string]bool{}
		for _, target := range fdsBefore {
			runtimeSeen[target] = slices.Contains(runtimeFiles, target)
		}
		for _, fd := range fds {
			target := now[fd]
			if before, ok := fdsBefore[fd]; ok && before == target {
				continue
			}
			if slices.Contains(runtimeFiles, target) && !runtimeSeen[target] {
				runtimeSeen[target] = true
				continue
			}
			if slices.ContainsFunc(c.files, func(p string) bool { return strings.HasPrefix(target, p) }) {
				continue
			}
			out = append(out, fmt.Sprintf("  file descriptor %d open: %s", fd, target))
		}
	}
	self := string(currentGoroutine())
	for _, g := range allGoroutines() {
		id := goroutineID(g)
		if goroutinesBefore[id] || bytes.HasPrefix(g, []byte(self)) || c.ignored(g) {
			continue
		}
		out = append(out, "  goroutine running:\n    "+strings.ReplaceAll(strings.TrimSpace(string(g)), "\n", "\n    "))
	}
	for _, p := range children() {
		what := "running"
		if p.state == "Z" {
			what = "a zombie nobody waited for"
		}
		out = append(out, fmt.Sprintf("  child process %d (%s, state %s) %s: %s", p.pid, p.comm, p.state, what, p.cmdline))
	}
	return out
}

// ignored reports whether goroutine g has a frame in an ignored function.
func (c *leakConfig) ignored(g []byte) bool {
	for _, line := range strings.Split(string(g), "\n") {
		if strings.HasPrefix(line, "\t") || strings.HasPrefix(line, "goroutine ") {
			continue
		}
		line = strings.TrimPrefix(line, "created by ")
		for _, f := range c.goroutines {
			if strings.HasPrefix(line, f) {
				return true
			}
		}
	}
	return false
}

// openFiles returns this process's open descriptors and their link
// targets. A descriptor closed while it is read (the directory's own) is
// left out.
func openFiles() (map[int]string, error) {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, fmt.Errorf("list open descriptors: %w", err)
	}
	fds := map[int]string{}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		link := filepath.Join("/proc/self/fd", e.Name())
		target, err := os.Readlink(link)
		if err != nil {
			continue
		}
		if magic, err := linux.FilesystemType(link); target == "/" && err == nil && magic == procMagic {
			target = privateProc
		}
		fds[fd] = target
	}
	return fds, nil
}

// allGoroutines returns the stack of every goroutine, one entry each.
func allGoroutines() [][]byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Split(buf[:n], []byte("\n\n"))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// currentGoroutine returns the calling goroutine's header line
// ("goroutine N ").
func currentGoroutine() []byte {
	buf := make([]byte, 64)
	n := runtime.Stack(buf, false)
	id := goroutineID(buf[:n])
	return []byte("goroutine " + id + " ")
}

// goroutineID returns the number of the goroutine whose stack is g.
func goroutineID(g []byte) string {
	fields := strings.Fields(string(bytes.TrimLeft(g, "\n")))
	if len(fields) < 2 || fields[0] != "goroutine" {
		return ""
	}
	return fields[1]
}

// goroutineIDs returns the numbers of the goroutines of stacks.
func goroutineIDs(stacks [][]byte) map[string]bool {
	ids := map[string]bool{}
	for _, g := range stacks {
		ids[goroutineID(g)] = true
	}
	return ids
}

// child is a process whose parent is this one.
type child struct {
	pid         int
	comm, state string
	cmdline     string
}

// children lists this process's child processes, zombies included, from
// /proc/<pid>/stat.
func children() []child {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var out []child
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
		if open < 0 || end < open {
			continue
		}
		rest := strings.Fields(string(b[end+1:]))
		if len(rest) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(rest[1]); err != nil || ppid != self {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out = append(out, child{
			pid:     pid,
			comm:    string(b[open+1 : end]),
			state:   rest[0],
			cmdline: strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " ")),
		})
	}
	return out
}
