package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// proberEnv switches a test binary into the prober child (see Main).
const proberEnv = "GPUISO_TESTENV_PROBER"

// Main runs a package's tests; test binaries that use StartProber call it
// from TestMain. In a prober child it serves opens instead and never returns.
func Main(m *testing.M) {
	if os.Getenv(proberEnv) == "1" {
		serveProber()
	}
	os.Exit(m.Run())
}

// serveProber answers each path read from stdin with the result of a
// read-write open: "ok", "ENXIO", "EPERM", "ENOENT" or the error.
func serveProber() {
	in := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	for in.Scan() {
		f, err := os.OpenFile(in.Text(), os.O_RDWR, 0)
		if err == nil {
			f.Close()
		}
		fmt.Fprintln(out, OpenResult(err))
		out.Flush()
	}
	os.Exit(0)
}

// OpenResult names the outcome of an open as the probes report it.
func OpenResult(err error) string {
	for _, e := range []struct {
		errno syscall.Errno
		name  string
	}{{syscall.ENXIO, "ENXIO"}, {syscall.EPERM, "EPERM"}, {syscall.EACCES, "EACCES"}, {syscall.ENOENT, "ENOENT"}, {syscall.EROFS, "EROFS"}} {
		if errors.Is(err, e.errno) {
			return e.name
		}
	}
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// Prober is a child process that opens device nodes on request, from inside
// whatever cgroup the test moved it into.
type Prober struct {
	Pid int

	mu  sync.Mutex
	in  *bufio.Writer
	out *bufio.Scanner
	cmd *exec.Cmd
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
	return &Prober{Pid: cmd.Process.Pid, in: bufio.NewWriter(stdin), out: bufio.NewScanner(stdout), cmd: cmd}
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
