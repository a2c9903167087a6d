package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// The kill points are reached with a runc that stops there: the test
// binary, run through a script that sets stopRuncEnv, acts as runc
// (stoppingRunc) and, at the command its control directory names, tells
// the test it got there (a FIFO) and waits for the test to let it go
// (another FIFO), before or after running the real runc.
const (
	// stopRuncEnv names the control directory of a stopping runc.
	stopRuncEnv = "GPUISO_RUNTIME_TEST_STOP"
	// realRuncEnv names the real runc it runs.
	realRuncEnv = "GPUISO_RUNTIME_TEST_RUNC"
)

// stoppingRunc is runc with os.Args, stopping where ctl/at says ("create
// before", "create after"; read once): it writes its parent's pid to the
// FIFO ctl/reached, and a SIGTERM it gets meanwhile to the FIFO ctl/signal,
// then waits for ctl/go to be opened and closed. It returns runc's status.
func stoppingRunc(ctl string) int {
	realRunc := os.Getenv(realRuncEnv)
	args := os.Args[1:]
	at, _ := os.ReadFile(filepath.Join(ctl, "at"))
	cmd, when, _ := strings.Cut(strings.TrimSpace(string(at)), " ")
	if cmd == "" || runcCommand(args) != cmd {
		err := syscall.Exec(realRunc, append([]string{realRunc}, args...), os.Environ())
		fmt.Fprintln(os.Stderr, "stopping runc:", err)
		return 127
	}
	os.Remove(filepath.Join(ctl, "at"))
	terms := make(chan os.Signal, 1)
	signal.Notify(terms, syscall.SIGTERM)
	go func() {
		for range terms {
			writeFIFO(filepath.Join(ctl, "signal"), "TERM")
		}
	}()
	if when == "before" {
		writeFIFO(filepath.Join(ctl, "reached"), strconv.Itoa(os.Getppid()))
		readFIFO(filepath.Join(ctl, "go"))
		signal.Reset()
		err := syscall.Exec(realRunc, append([]string{realRunc}, args...), os.Environ())
		fmt.Fprintln(os.Stderr, "stopping runc:", err)
		return 127
	}
	// The files this process inherited (the record's lock among them) are
	// not close-on-exec: the real runc inherits them too.
	c := exec.Command(realRunc, args...)
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
	code := 0
	if err := c.Run(); err != nil {
		code = 1
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		}
	}
	writeFIFO(filepath.Join(ctl, "reached"), strconv.Itoa(os.Getppid()))
	readFIFO(filepath.Join(ctl, "go"))
	return code
}

// runcCommand is the subcommand of runc's arguments.
func runcCommand(args []string) string {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			return a
		}
		if name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "="); !hasValue && slices.Contains(runcValueFlags, name) {
			i++
		}
	}
	return ""
}

func writeFIFO(path, s string) {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err == nil {
		io.WriteString(f, s+"\n")
		f.Close()
	}
}

func readFIFO(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

// stopper is the test's side of a stopping runc.
type stopper struct {
	dir  string
	runc string // the script to pass as --runc
}

// newStopper makes a stopping runc that stops at at ("create before",
// "create after").
func newStopper(t *testing.T, at string) *stopper {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	realRunc, err := exec.LookPath("runc")
	if err != nil {
		t.Fatal(err)
	}
	s := &stopper{dir: t.TempDir()}
	for _, f := range []string{"reached", "go", "signal"} {
		if err := syscall.Mkfifo(filepath.Join(s.dir, f), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(s.dir, "at"), []byte(at), 0o600); err != nil {
		t.Fatal(err)
	}
	s.runc = filepath.Join(s.dir, "runc")
	script := fmt.Sprintf("#!/bin/sh\n%s=%s %s=%s exec %s \"$@\"\n", stopRuncEnv, s.dir, realRuncEnv, realRunc, exe)
	if err := os.WriteFile(s.runc, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return s
}

// await reads the FIFO name, within a minute.
func (s *stopper) await(t *testing.T, name string) string {
	t.Helper()
	got := make(chan string, 1)
	go func() { got <- readFIFO(filepath.Join(s.dir, name)) }()
	select {
	case v := <-got:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("the stopping runc never wrote %s", name)
		return ""
	}
}

// release lets the stopping runc go on.
func (s *stopper) release(t *testing.T) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(filepath.Join(s.dir, "go"), os.O_WRONLY, 0)
		if err == nil {
			err = f.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the stopping runc does not wait to be let go")
	}
}

// rig is a simulated 8-GPU node, a state directory and a runc root for
// gpuiso-runtime with runc.
type rig struct {
	bin, sim, state, root, probe string
}

func newRig(t *testing.T) *rig {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireNVIDIALibraries(t)
	testenv.RequireRunc(t)
	r := &rig{bin: buildRuntime(t), state: t.TempDir(), root: t.TempDir(), probe: testenv.BuildProbe(t)}
	r.sim, _, _ = simNode(t, "dgx1-volta")
	return r
}

// global are gpuiso-runtime's global flags for root ("" for runc's
// default).
func (r *rig) global(root string) []string {
	// The bundles are the test's own: their environment asks.
	g := []string{"--simulate", "dgx1-volta", "--dev-root", r.sim, "--state-dir", r.state, "--accept-env-request", "always"}
	if root != "" {
		g = append(g, "--root", root)
	}
	return g
}

// run runs gpuiso-runtime with r's flags for root, then args.
func (r *rig) run(t *testing.T, root string, args ...string) (string, error) {
	t.Helper()
	return runtimeOut(t, r.bin, append(r.global(root), args...)...)
}

// owner is the owner of container id in root ("" for runc's default).
func (r *rig) owner(t *testing.T, id, root string) string {
	t.Helper()
	if root == "" {
		root = defaultRuncRoot
	}
	o, err := ownerOf(id, resolvePath(root))
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// forget deletes container id of root with runc and drops what the host's
// volume directory and index keep of it, when the test ends.
func (r *rig) forget(t *testing.T, id, root string) { forgetContainer(t, id, root) }

// forgetContainer, when t ends, deletes container id of runc root root (""
// for runc's default) with runc, and drops what the host's volume
// directory and gpuiso-runtime's index keep of it.
func forgetContainer(t *testing.T, id, root string) {
	if root == "" {
		root = defaultRuncRoot
	}
	owner, err := ownerOf(id, resolvePath(root))
	t.Cleanup(func() {
		exec.Command("runc", "--root", root, "delete", "--force", id).Run()
		if err == nil {
			releaseVolumeUse(context.Background(), owner)
			os.Remove(filepath.Join(defaultIndexDir, owner+".json"))
		}
	})
}

// holders reads the allocator's state in dir: each owner's holder (nil for
// none).
func holders(t *testing.T, dir string) map[string]*allocator.Holder {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "allocations.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		State struct {
			Owners []struct {
				Owner  string            `json:"owner"`
				Holder *allocator.Holder `json:"holder"`
			} `json:"owners"`
		} `json:"state"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	out := map[string]*allocator.Holder{}
	for _, o := range st.State.Owners {
		out[o.Owner] = o.Holder
	}
	return out
}

// initPid is the pid of container id's init in root, as runc says.
func initPid(t *testing.T, root, id string) int {
	t.Helper()
	st, err := runcState(context.Background(), "runc", root, id)
	if err != nil {
		t.Fatal(err)
	}
	return st.Pid
}

// expectHeld checks that owner alone holds gpu, by init when pid is not 0
// (by nobody when it is), with a use of the driver volume.
func (r *rig) expectHeld(t *testing.T, owner string, gpu, pid int) {
	t.Helper()
	got := owners(t, r.state)
	if !slices.Equal(got[owner], []int{gpu}) || len(got) != 1 {
		t.Errorf("owners %v, want %s alone holding GPU %d", got, owner, gpu)
	}
	h := holders(t, r.state)[owner]
	switch {
	case pid == 0 && h != nil:
		t.Errorf("%s held by %+v, want the record alone (no holder)", owner, *h)
	case pid != 0 && (h == nil || h.Pid != pid):
		t.Errorf("%s held by %v, want the container's init %d", owner, h, pid)
	}
	if !usesVolume(context.Background(), owner) {
		t.Errorf("%s does not use the driver volume", owner)
	}
}

// expectReleased checks that nothing of owner is left: no GPU, no use of
// the driver volume, no record, lock file or index entry.
func (r *rig) expectReleased(t *testing.T, owner string) {
	t.Helper()
	if got := owners(t, r.state); len(got[owner]) != 0 {
		t.Errorf("owners %v still list %s", got, owner)
	}
	if usesVolume(context.Background(), owner) {
		t.Errorf("%s still uses the driver volume", owner)
	}
	for _, p := range []string{
		filepath.Join(r.state, recordsDir, owner+".json"),
		filepath.Join(r.state, recordsDir, owner+".lock"),
		filepath.Join(defaultIndexDir, owner+".json"),
	} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left (%v)", p, err)
		}
	}
}

// expectRefused runs cmd ("create", "run -d") for container id of root
// asking for gpu, and checks that it is refused in one line naming holder,
// and runc created nothing.
func (r *rig) expectRefused(t *testing.T, cmd, id, root string, gpu int, holder string) {
	t.Helper()
	r.forget(t, id, root)
	out, err := r.run(t, root, append(strings.Fields(cmd), "--bundle", sleepBundle(t, r.probe, strconv.Itoa(gpu)), id)...)
	if err == nil || strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "gpuiso-runtime: ") || !strings.Contains(out, "owned by "+holder) {
		t.Errorf("%s of GPU %d held by %s: %v\n%s", cmd, gpu, holder, err, out)
	}
	if root == "" {
		root = defaultRuncRoot
	}
	if _, err := exec.Command("runc", "--root", root, "state", id).CombinedOutput(); err == nil {
		t.Errorf("the refused container %s exists in runc", id)
	}
}

// expectDevice checks that running container id of root opens gpu's node
// (allowed: no driver behind a simulated major).
func expectDevice(t *testing.T, root, id string, gpu int) {
	t.Helper()
	node := fmt.Sprintf("/dev/nvidia%d", gpu)
	out, err := exec.Command("runc", "--root", root, "exec", id, "/probe", "open", node).CombinedOutput()
	lines := map[string]bool{}
	for l := range strings.Lines(string(out)) {
		lines[strings.TrimSpace(l)] = true
	}
	if err != nil || !testenv.Opened(lines, node) {
		t.Errorf("%s in %s: %v\n%s", node, id, err, out)
	}
}

// waitUnlocked waits, at most a minute, until no process holds owner's
// record lock.
func (r *rig) waitUnlocked(t *testing.T, owner string) {
	t.Helper()
	f, err := os.Open(filepath.Join(r.state, recordsDir, owner+".lock"))
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := linux.Lock(ctx, f); err != nil {
		t.Fatalf("the lock of %s stays held: %v", owner, err)
	}
}

// TestKillCreate: gpuiso-runtime killed while runc create runs (SIGKILL
// before runc starts, or as it returns) or stopped (SIGTERM as runc
// returns) never leaves the GPU to a dead process: while runc works the
// claim is the container's record's, and a second container asking for the
// GPU is refused; once runc is done, the claim is held by the container's
// init (at once after SIGTERM; after a SIGKILL, by the next create, which is
// refused), the container opens its GPU, and deleting it gives everything
// back. The conformance suite's sampler sees no GPU allowed to two
// containers, nor one the allocator does not hold for its container.
func TestKillCreate(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   string
		sig  syscall.Signal
	}{
		{name: "SIGKILL before runc create", at: "create before", sig: syscall.SIGKILL},
		{name: "SIGKILL as runc create returns", at: "create after", sig: syscall.SIGKILL},
		{name: "SIGTERM as runc create returns", at: "create after", sig: syscall.SIGTERM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			w := r.watch(t)
			stop := newStopper(t, tc.at)
			id := fmt.Sprintf("gpuiso-kill-%d", time.Now().UnixNano())
			owner := r.owner(t, id, r.root)
			r.forget(t, id, r.root)
			out, err := os.Create(filepath.Join(t.TempDir(), "out"))
			if err != nil {
				t.Fatal(err)
			}
			defer out.Close()
			cmd := exec.Command(r.bin, append(r.global(r.root), "--runc", stop.runc, "create", "--bundle", sleepBundle(t, r.probe, "6"), id)...)
			cmd.Stdout, cmd.Stderr = out, out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := false
			t.Cleanup(func() {
				if !exited {
					cmd.Process.Kill()
					cmd.Wait()
				}
			})
			if pid := stop.await(t, "reached"); pid != strconv.Itoa(cmd.Process.Pid) {
				t.Fatalf("runc's parent %s, want gpuiso-runtime %d", pid, cmd.Process.Pid)
			}
			if err := cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			if tc.sig == syscall.SIGKILL {
				cmd.Wait()
				exited = true
				// runc still works: the claim is the record's.
				r.expectRefused(t, "create", id+"-b", r.root, 6, owner)
				r.expectHeld(t, owner, 6, 0)
				stop.release(t)
				r.waitUnlocked(t, owner)
				// The next create settles the record: the container lives.
				r.expectRefused(t, "create", id+"-c", r.root, 6, owner)
			} else {
				if got := stop.await(t, "signal"); got != "TERM" {
					t.Fatalf("runc got %q, want the SIGTERM passed on", got)
				}
				stop.release(t)
				err := cmd.Wait()
				exited = true
				b, _ := os.ReadFile(out.Name())
				if err != nil {
					t.Fatalf("create: %v\n%s", err, b)
				}
			}
			r.expectHeld(t, owner, 6, initPid(t, r.root, id))
			if out, err := exec.Command("runc", "--root", r.root, "start", id).CombinedOutput(); err != nil {
				t.Fatalf("runc start: %v: %s", err, out)
			}
			expectDevice(t, r.root, id, 6)
			r.expectRefused(t, "create", id+"-d", r.root, 6, owner)
			w.expectSeen(t, 1)
			if out, err := r.run(t, r.root, "delete", "--force", id); err != nil {
				t.Fatalf("delete: %v\n%s", err, out)
			}
			r.expectReleased(t, owner)
		})
	}
}

// TestKillForegroundRun: gpuiso-runtime killed (SIGKILL) during a
// foreground "run" leaves the claim with the container, which runc run
// keeps running: a second container asking for its GPU is refused. Once the
// container ends (and runc run with it), the next create gets the GPU and
// the dead one's use of the driver volume is gone.
func TestKillForegroundRun(t *testing.T) {
	r := newRig(t)
	w := r.watch(t)
	id := fmt.Sprintf("gpuiso-killrun-%d", time.Now().UnixNano())
	owner := r.owner(t, id, r.root)
	r.forget(t, id, r.root)
	b := sleepBundle(t, r.probe, "6")
	setArgs(t, b, "/probe", "do", "env", "NVIDIA_VISIBLE_DEVICES", "--", "sleep", "600")
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	cmd := exec.Command(r.bin, append(r.global(r.root), "run", "--bundle", b, id)...)
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	exited := false
	t.Cleanup(func() {
		if !exited {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	running := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		var seen []string
		for sc.Scan() {
			seen = append(seen, sc.Text())
			if strings.HasPrefix(sc.Text(), "NVIDIA_VISIBLE_DEVICES=GPU-") {
				running <- ""
				io.Copy(io.Discard, pr)
				return
			}
		}
		running <- strings.Join(seen, "\n")
	}()
	select {
	case out := <-running:
		if out != "" {
			t.Fatalf("run ended before the container ran:\n%s", out)
		}
	case <-time.After(time.Minute):
		t.Fatal("the container does not run")
	}
	cmd.Process.Kill()
	cmd.Wait()
	exited = true
	r.expectRefused(t, "create", id+"-b", r.root, 6, owner)
	r.expectHeld(t, owner, 6, 0)
	expectDevice(t, r.root, id, 6)
	w.expectSeen(t, 1)

	// The container ends; runc run deletes it and goes.
	if out, err := exec.Command("runc", "--root", r.root, "kill", id, "KILL").CombinedOutput(); err != nil {
		t.Fatalf("runc kill: %v: %s", err, out)
	}
	r.waitUnlocked(t, owner)
	next := id + "-c"
	r.forget(t, next, r.root)
	if out, err := r.run(t, r.root, "create", "--bundle", sleepBundle(t, r.probe, "6"), next); err != nil {
		t.Fatalf("create of GPU 6 after the container ended: %v\n%s", err, out)
	}
	r.expectReleased(t, owner)
	if out, err := r.run(t, r.root, "delete", "--force", next); err != nil {
		t.Fatalf("delete: %v\n%s", err, out)
	}
	r.expectReleased(t, r.owner(t, next, r.root))
}

// lastLine is the last line of out.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// setArgs makes args the process of bundle dir.
func setArgs(t *testing.T, dir string, args ...string) {
	t.Helper()
	cfg := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	spec["process"].(map[string]any)["args"] = args
	if raw, err = json.Marshal(spec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestRunDetached: "run -d" keeps the claim for the container's life, held
// by its init: a second "run -d" of its GPU is refused, and the first
// container opens its GPU.
func TestRunDetached(t *testing.T) {
	r := newRig(t)
	w := r.watch(t)
	id := fmt.Sprintf("gpuiso-rund-%d", time.Now().UnixNano())
	owner := r.owner(t, id, r.root)
	r.forget(t, id, r.root)
	if out, err := r.run(t, r.root, "run", "-d", "--bundle", sleepBundle(t, r.probe, "6"), id); err != nil {
		t.Fatalf("run -d: %v\n%s", err, out)
	}
	r.expectHeld(t, owner, 6, initPid(t, r.root, id))
	r.expectRefused(t, "run -d", id+"-b", r.root, 6, owner)
	expectDevice(t, r.root, id, 6)
	w.expectSeen(t, 1)
	if out, err := r.run(t, r.root, "delete", "--force", id); err != nil {
		t.Fatalf("delete: %v\n%s", err, out)
	}
	r.expectReleased(t, owner)
}

// TestForeignRootDelete: containers of one id in two runc roots are two
// owners; a delete in one root (or in a root that has no such container,
// or with no flags at all) gives back only what the container of that root
// holds.
func TestForeignRootDelete(t *testing.T) {
	r := newRig(t)
	other := t.TempDir()
	w := r.watch(t, other)
	id := fmt.Sprintf("gpuiso-roots-%d", time.Now().UnixNano())
	mine, theirs := r.owner(t, id, r.root), r.owner(t, id, other)
	r.forget(t, id, r.root)
	r.forget(t, id, other)
	if out, err := r.run(t, r.root, "create", "--bundle", sleepBundle(t, r.probe, "6"), id); err != nil {
		t.Fatalf("create in %s: %v\n%s", r.root, err, out)
	}
	if out, err := r.run(t, other, "create", "--bundle", sleepBundle(t, r.probe, "7"), id); err != nil {
		t.Fatalf("create of the same id in %s: %v\n%s", other, err, out)
	}
	if got := owners(t, r.state); !slices.Equal(got[mine], []int{6}) || !slices.Equal(got[theirs], []int{7}) {
		t.Fatalf("owners %v, want %s holding GPU 6 and %s GPU 7", got, mine, theirs)
	}
	w.expectSeen(t, 2)
	if out, err := r.run(t, other, "delete", "--force", id); err != nil {
		t.Fatalf("delete in %s: %v\n%s", other, err, out)
	}
	r.expectHeld(t, mine, 6, initPid(t, r.root, id))
	r.expectReleased(t, theirs)
	for _, args := range [][]string{
		append(r.global(filepath.Join(other, "none")), "delete", "--force", id),
		append(r.global(other), "delete", "--force", id),
		{"delete", "--force", id},
	} {
		runtimeOut(t, r.bin, args...)
		r.expectHeld(t, mine, 6, initPid(t, r.root, id))
	}
	r.expectRefused(t, "create", id, other, 6, mine)
	if out, err := r.run(t, r.root, "delete", "--force", id); err != nil {
		t.Fatalf("delete: %v\n%s", err, out)
	}
	r.expectReleased(t, mine)
}

// TestFlaglessDelete: a delete run without any flag (as Podman's cleanup
// runs it) gives back the GPUs and the driver volume use of the container
// it names in runc's default root, found through the index.
func TestFlaglessDelete(t *testing.T) {
	r := newRig(t)
	id := fmt.Sprintf("gpuiso-flagless-%d", time.Now().UnixNano())
	owner := r.owner(t, id, "")
	r.forget(t, id, "")
	if out, err := r.run(t, "", "create", "--bundle", sleepBundle(t, r.probe, "6"), id); err != nil {
		t.Fatalf("create: %v\n%s", err, out)
	}
	r.expectHeld(t, owner, 6, initPid(t, defaultRuncRoot, id))
	if lookupIndex(defaultIndexDir, owner) != r.state {
		t.Errorf("no index entry for %s", owner)
	}
	if out, err := runtimeOut(t, r.bin, "delete", "--force", id); err != nil {
		t.Fatalf("delete without flags: %v\n%s", err, out)
	}
	r.expectReleased(t, owner)
	if got := owners(t, r.state); len(got) != 0 {
		t.Errorf("after the delete: owners %v", got)
	}
}

// TestPodmanCleanup: "podman rm" runs gpuiso-runtime's delete without the
// runtime flags "podman run" had; the container's GPU and driver volume use
// are given back all the same, and so after "podman run --rm".
func TestPodmanCleanup(t *testing.T) {
	podman := testenv.RequirePodman(t)
	r := newRig(t)
	img := testenv.BuildPodmanProbeImage(t, podman)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	podmanRun := func(name string, flags []string, cmd ...string) (string, error) {
		a := append([]string{"run", "--name", name, "--network", "none", "--runtime", r.bin,
			"--runtime-flag", "simulate=dgx1-volta", "--runtime-flag", "dev-root=" + r.sim, "--runtime-flag", "state-dir=" + r.state,
			"-e", "NVIDIA_VISIBLE_DEVICES=6"}, testenv.PodmanRunFlags...)
		t.Cleanup(func() { testenv.RunPodman(context.Background(), podman, "rm", "-f", "-t", "0", name) })
		return testenv.RunPodman(ctx, podman, append(append(append(a, flags...), img), cmd...)...)
	}
	name := fmt.Sprintf("gpuiso-cleanup-%d", time.Now().UnixNano())
	if _, err := podmanRun(name, []string{"-d"}, "sleep", "600"); err != nil {
		t.Fatal(err)
	}
	id, err := testenv.RunPodman(ctx, podman, "inspect", "--format", "{{.Id}}", name)
	if err != nil {
		t.Fatal(err)
	}
	id = lastLine(id) // after runc's warnings
	owner := r.owner(t, id, "")
	r.forget(t, id, "")
	r.expectHeld(t, owner, 6, initPid(t, defaultRuncRoot, id))
	if _, err := testenv.RunPodman(ctx, podman, "rm", "-f", "-t", "0", name); err != nil {
		t.Fatal(err)
	}
	r.expectReleased(t, owner)
	if got := owners(t, r.state); len(got) != 0 {
		t.Errorf("after podman rm: owners %v", got)
	}

	rm := fmt.Sprintf("gpuiso-cleanup-%d", time.Now().UnixNano())
	if out, err := podmanRun(rm, []string{"--rm"}, "exit", "0"); err != nil {
		t.Fatalf("podman run --rm of GPU 6 after rm: %v\n%s", err, out)
	}
	if got := owners(t, r.state); len(got) != 0 {
		t.Errorf("after podman run --rm: owners %v", got)
	}
}
