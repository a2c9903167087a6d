package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// proberEnv switches a test binary into the prober child (see Main).
const proberEnv = "GPUISO_TESTENV_PROBER"

// Main runs a package's tests; test binaries that use StartProber call it
// from TestMain. In a prober child it serves opens instead and never returns.
func Main(m *testing.M) {
	runMain(m.Run)
}

// MainCheckingLeaks is Main with CheckLeaks around the tests: a run that
// leaves a descriptor open, a goroutine running or a child process behind
// fails.
func MainCheckingLeaks(m *testing.M, opts ...LeakOption) {
	runMain(func() int { return CheckLeaks(m, opts...) })
}

// runMain serves opens in a prober child; otherwise it runs the tests with
// their temporary files off the host's /tmp and exits with their code.
func runMain(run func() int) {
	if os.Getenv(proberEnv) == "1" {
		serveProber()
	}
	cleanup := OffHostTmp()
	code := run()
	cleanup()
	os.Exit(code)
}

// testRoot holds root test runs' temporary directories: a directory of
// root's own, not one of the host's shared temporary directories, which
// native containers cover with private ones.
const testRoot = "/var/lib/gpuiso-test"

// exeEnv names a copy of the test binary that containers can run (see
// OffHostTmp).
const exeEnv = "GPUISO_TESTENV_EXE"

// RunsDir is where OffHostTmp puts the temporary directories of root test
// runs, every package's: a native container that keeps the host's view
// sees it, with the sockets of the daemons other packages' tests started
// meanwhile, where on a real host they would be in a /tmp it does not see.
func RunsDir() string { return testRoot }

// OffHostTmp moves a root test run's temporary files off the host's /tmp
// and /var/tmp, which every native container covers with private ones:
// TMPDIR (and with it t.TempDir) becomes a fresh directory under testRoot,
// and the test
// binary, which go test leaves under /tmp, is copied there for containers
// to run (ProberCommand, Executable). It returns the clean-up, which
// removes that directory. Without root it changes nothing.
func OffHostTmp() func() {
	if !linux.IsRoot() || os.Getenv(exeEnv) != "" {
		return func() {}
	}
	if err := os.MkdirAll(testRoot, 0o700); err != nil {
		return func() {}
	}
	dir, err := os.MkdirTemp(testRoot, "test-")
	if err != nil {
		return func() {}
	}
	exe, err := os.Executable()
	if err == nil {
		err = copyExecutable(exe, filepath.Join(dir, filepath.Base(exe)))
	}
	if err != nil {
		os.RemoveAll(dir)
		return func() {}
	}
	os.Setenv("TMPDIR", dir)
	os.Setenv(exeEnv, filepath.Join(dir, filepath.Base(exe)))
	return func() { os.RemoveAll(dir) }
}

func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Executable is the test binary as a container can run it: the copy
// OffHostTmp made, or the binary itself.
func Executable(tb testing.TB) string {
	if p := os.Getenv(exeEnv); p != "" {
		return p
	}
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	return exe
}

// serveProber answers each request read from stdin: a path gets the result
// of a read-write open ("ok", "ENXIO", "EPERM", "ENOENT" or the error);
// "mknod PATH MAJOR MINOR" the result of creating that character node.
func serveProber() {
	in := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	for in.Scan() {
		var err error
		var path string
		var major, minor uint32
		if n, _ := fmt.Sscanf(in.Text(), "mknod %s %d %d", &path, &major, &minor); n == 3 {
			err = linux.Mknod(path, 0o666, linux.DeviceNumber{Char: true, Major: major, Minor: minor})
		} else {
			var f *os.File
			if f, err = os.OpenFile(in.Text(), os.O_RDWR, 0); err == nil {
				f.Close()
			}
		}
		fmt.Fprintln(out, OpenResult(err))
		out.Flush()
	}
	os.Exit(0)
}

// ProberCommand is the command and environment that run a prober: this test
// binary again, with the variable that makes Main serve requests on stdin.
// Use it to run a prober inside a container; NewProber talks to it.
func ProberCommand(tb testing.TB) (args []string, env string) {
	return []string{Executable(tb), "-test.run=^$"}, proberEnv + "=1"
}

// NewProber talks to a prober through its stdin and stdout.
func NewProber(stdin io.Writer, stdout io.Reader) *Prober {
	return &Prober{in: bufio.NewWriter(stdin), out: bufio.NewScanner(stdout)}
}

// OpenResult names the outcome of an open as the probes report it.
func OpenResult(err error) string {
	for _, e := range []struct {
		errno syscall.Errno
		name  string
	}{{syscall.ENXIO, "ENXIO"}, {syscall.ENODEV, "ENODEV"}, {syscall.EPERM, "EPERM"}, {syscall.EACCES, "EACCES"}, {syscall.ENOENT, "ENOENT"}, {syscall.EROFS, "EROFS"}} {
		if errors.Is(err, e.errno) {
			return e.name
		}
	}
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// Allowed reports whether an open's result (as OpenResult names it) means
// the device cgroup let the open through: anything but EPERM (denied) and
// ENOENT (no such node). Where it is allowed, the driver behind the major
// answers: ENXIO where none owns it, ENODEV for a minor a loaded NVIDIA
// driver does not know, success for a real device.
func Allowed(result string) bool {
	return result != "" && result != "EPERM" && result != "ENOENT"
}

// Opened reports whether the probe output lines (as a set) say that path
// was opened with an allowed result.
func Opened(lines map[string]bool, path string) bool {
	for l := range lines {
		if res, ok := strings.CutPrefix(l, path+" "); ok && !strings.Contains(res, " ") && Allowed(res) {
			return true
		}
	}
	return false
}

// Prober is a child process that opens device nodes on request, from inside
// whatever cgroup the test moved it into.
type Prober struct {
	// Pid is the prober's process id (0 when made by NewProber).
	Pid int

	mu  sync.Mutex
	in  *bufio.Writer
	out *bufio.Scanner
}

// StartProber starts a prober child (the test binary again; its TestMain
// must call Main) and lets enter move it into a cgroup before its first
// open. The child is killed when tb ends.
func StartProber(tb testing.TB, enter func(pid int) error) *Prober {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), proberEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	if enter != nil {
		if err := enter(cmd.Process.Pid); err != nil {
			tb.Fatalf("move prober %d into its cgroup: %v", cmd.Process.Pid, err)
		}
	}
	p := NewProber(stdin, stdout)
	p.Pid = cmd.Process.Pid
	return p
}

// Open asks the prober to open path read-write and returns the result
// ("ok", "ENXIO", "EPERM", ...). It is safe for concurrent use.
func (p *Prober) Open(path string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if strings.ContainsRune(path, '\n') {
		return "", fmt.Errorf("path %q has a newline", path)
	}
	fmt.Fprintln(p.in, path)
	if err := p.in.Flush(); err != nil {
		return "", fmt.Errorf("prober: %w", err)
	}
	if !p.out.Scan() {
		return "", fmt.Errorf("prober exited: %v", p.out.Err())
	}
	return p.out.Text(), nil
}

// Mknod asks the prober to create the character node major:minor at path.
func (p *Prober) Mknod(path string, major, minor uint32) (string, error) {
	return p.Open(fmt.Sprintf("mknod %s %d %d", path, major, minor))
}

// OpenAll opens each path and returns the results by path.
func (p *Prober) OpenAll(paths ...string) (map[string]string, error) {
	got := map[string]string{}
	for _, path := range paths {
		r, err := p.Open(path)
		if err != nil {
			return nil, err
		}
		got[path] = r
	}
	return got, nil
}
