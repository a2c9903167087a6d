package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/volume"
)

// stateRoot is where gpuiso's programs keep their state by default: the
// driver volumes, simulated nodes, and here a state directory.
const stateRoot = "/var/run/gpuiso"

// TestStrangerLocks: with the user nobody holding a flock on every file
// and directory under the state root and gpuiso-runtime's index that they
// can open, a GPU container is created and deleted as before, and its use
// of the driver volume is given back.
func TestStrangerLocks(t *testing.T) {
	r := newRig(t)
	if err := os.MkdirAll(stateRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	// A state directory as an operator makes one: others may read it.
	state, err := os.MkdirTemp(stateRoot, "strangerlock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	if err := os.Chmod(state, 0o755); err != nil {
		t.Fatal(err)
	}
	r.state = state
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Once before the stranger starts, so that the driver volume, its lock
	// and records, the state directory's lock, state and records exist.
	before := fmt.Sprintf("gpuiso-stranger-a-%d", time.Now().UnixNano())
	r.forget(t, before, r.root)
	if out, err := r.run(t, r.root, "create", "--bundle", sleepBundle(t, r.probe, "0"), before); err != nil {
		t.Fatalf("create before the stranger: %v\n%s", err, out)
	}

	// Forgotten after the stranger ends (cleanups run last first).
	during := fmt.Sprintf("gpuiso-stranger-b-%d", time.Now().UnixNano())
	r.forget(t, during, r.root)
	held := holdAsStranger(t, stateRoot, defaultIndexDir)
	if !slices.Contains(held, volume.DefaultRoot) {
		t.Fatalf("nobody holds no flock on %s (they hold %q): the test shows nothing", volume.DefaultRoot, held)
	}
	t.Logf("nobody holds a flock on %d files and directories", len(held))

	if out, err := r.run(t, r.root, "--timeout", "20s", "create", "--bundle", sleepBundle(t, r.probe, "1"), during); err != nil {
		t.Fatalf("create while nobody holds every flock they can: %v\n%s", err, out)
	}
	for _, id := range []string{before, during} {
		owner := r.owner(t, id, r.root)
		if !usesVolume(ctx, owner) {
			t.Errorf("%s does not use the driver volume", id)
		}
		if out, err := r.run(t, r.root, "delete", "--force", id); err != nil {
			t.Fatalf("delete %s: %v\n%s", id, err, out)
		}
		if usesVolume(ctx, owner) {
			t.Errorf("%s still uses the driver volume after its delete", id)
		}
	}
	if err := ctx.Err(); err != nil {
		t.Fatal(err)
	}
}

// strangerRootsEnv lists, for TestStrangerProcess, the directories whose
// files and directories it holds.
const strangerRootsEnv = "GPUISO_RUNTIME_STRANGER_ROOTS"

// holdAsStranger starts this test binary as nobody (uid and gid 65534, no
// other group), copied where nobody may run it, to hold a flock on every
// file and directory under roots that it can open, until the test ends.
// It returns the paths held.
func holdAsStranger(t *testing.T, roots ...string) []string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "gpuiso-stranger-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	exe, err := os.Executable()
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	var b []byte
	if err == nil {
		b, err = os.ReadFile(exe)
	}
	bin := filepath.Join(dir, "stranger")
	if err == nil {
		err = os.WriteFile(bin, b, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestStrangerProcess$")
	cmd.Env = []string{strangerRootsEnv + "=" + strings.Join(roots, string(filepath.ListSeparator))}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	var held []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "held "); ok {
			held = append(held, p)
		} else if strings.HasPrefix(sc.Text(), "holding ") {
			return held
		}
	}
	t.Fatalf("the stranger ended before holding anything: %v", sc.Err())
	return nil
}

// TestStrangerProcess is the stranger holdAsStranger starts: it takes an
// exclusive flock on every regular file and directory it can open under
// the roots strangerRootsEnv lists, prints "held PATH" for each and then
// "holding N", and keeps them until its stdin closes. Run otherwise, it
// does nothing.
func TestStrangerProcess(t *testing.T) {
	roots := os.Getenv(strangerRootsEnv)
	if roots == "" {
		t.Skip("run by TestStrangerLocks as nobody")
	}
	var held []*os.File
	for _, root := range filepath.SplitList(roots) {
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || (!d.IsDir() && !d.Type().IsRegular()) {
				return nil
			}
			f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
			if err != nil {
				f, err = os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0)
			}
			if err != nil {
				return nil
			}
			if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
				f.Close()
				return nil
			}
			held = append(held, f)
			fmt.Println("held", p)
			return nil
		})
	}
	fmt.Println("holding", len(held))
	io.Copy(io.Discard, os.Stdin)
}
