package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// The kill points through the engines that run gpuiso-runtime. Podman and
// Docker run a container with "create" and then "start", never a
// foreground "run" (the suite checks what they ask for), so the kill
// points of a create are theirs: SIGKILL before runc create, SIGKILL as it
// returns, SIGTERM as it returns. The engine's runtime is a script that
// runs gpuiso-runtime with a stopping runc (kill_test.go) and writes each
// command line the engine gives it to a file.

// killEngine is an engine running containers through such a script, on
// the rig's simulated node and state directory.
type killEngine struct {
	name string
	// root is the runc root of its containers.
	root string
	// cli runs the engine's command line.
	cli func(ctx context.Context, args ...string) *exec.Cmd
	// flags are run's flags for a container through gpuiso-runtime.
	flags []string
	img   string
	// calls holds the engine's command lines to the runtime, one a line.
	calls string
	stop  *stopper
	// firstLives says whether the container of a create whose runtime
	// was SIGKILLed lives on (and its engine waits for it) once runc is
	// done, or the engine deleted it.
	firstLives bool
}

// runtimeScript writes the script an engine runs as its runtime: it adds
// the engine's command line to calls and runs gpuiso-runtime with runc as
// its runc, on r's node and state directory.
func runtimeScript(t *testing.T, r *rig, runc, calls string) string {
	t.Helper()
	script := filepath.Join(t.TempDir(), "gpuiso-runtime")
	body := fmt.Sprintf("#!/bin/sh\nprintf '%%s\\n' \"$*\" >> %s\nexec %s --runc %s --simulate dgx1-volta --dev-root %s --state-dir %s \"$@\"\n",
		calls, r.bin, runc, r.sim, r.state)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return script
}

// stoppedAt makes the stopping runc stop at at ("create before", "create
// after") the next time.
func (s *stopper) stoppedAt(t *testing.T, at string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(s.dir, "at"), []byte(at), 0o600); err != nil {
		t.Fatal(err)
	}
}

// commands are the engine's command lines to the runtime so far, each as
// its subcommand and its last argument (the container id of a create).
func (e *killEngine) commands() [][2]string {
	b, _ := os.ReadFile(e.calls)
	var out [][2]string
	for l := range strings.Lines(string(b)) {
		args := strings.Fields(l)
		if len(args) > 0 {
			out = append(out, [2]string{runcCommand(args), args[len(args)-1]})
		}
	}
	return out
}

// created reports whether the engine asked the runtime to create a
// container of id.
func (e *killEngine) created(id string) bool {
	return slices.Contains(e.commands(), [2]string{"create", id})
}

// lastCreated is the id of the engine's last create.
func (e *killEngine) lastCreated(t *testing.T) string {
	t.Helper()
	cmds := e.commands()
	for i := len(cmds) - 1; i >= 0; i-- {
		if cmds[i][0] == "create" {
			return cmds[i][1]
		}
	}
	t.Fatal("the engine created nothing")
	return ""
}

// output runs the engine's command line, with its combined output.
func (e *killEngine) output(ctx context.Context, args ...string) (string, error) {
	out, err := e.cli(ctx, args...).CombinedOutput()
	return string(out), err
}

// runGPU6 is the engine's command line of a detached container name asking
// for GPU 6 and sleeping.
func (e *killEngine) runGPU6(name string) []string {
	return append(append(append([]string{"run", "-d", "--name", name}, e.flags...), "-e", "NVIDIA_VISIBLE_DEVICES=6", e.img), "sleep", "600")
}

// expectRefused runs a second container asking for GPU 6, which holder
// holds: the engine fails with gpuiso-runtime's line naming holder, and
// runc created nothing.
func (e *killEngine) expectRefused(t *testing.T, ctx context.Context, holder string) {
	t.Helper()
	name := fmt.Sprintf("gpuiso-enginekill-%d", time.Now().UnixNano())
	out, err := e.output(ctx, e.runGPU6(name)...)
	if err == nil || !strings.Contains(out, "owned by "+holder) {
		t.Errorf("%s run of GPU 6 held by %s: %v\n%s", e.name, holder, err, out)
	}
	id := e.lastCreated(t)
	if id == "" || strings.HasPrefix(holder, id+".") {
		return
	}
	if out, err := exec.Command("runc", "--root", e.root, "state", id).CombinedOutput(); err == nil {
		t.Errorf("runc has the refused container %s: %s", id, out)
	}
}

// expectGiven runs a second container asking for GPU 6, which nobody
// holds: it runs, holds GPU 6 and opens it; it is removed after.
func (e *killEngine) expectGiven(t *testing.T, ctx context.Context, r *rig) {
	t.Helper()
	name := fmt.Sprintf("gpuiso-enginekill-%d", time.Now().UnixNano())
	if out, err := e.output(ctx, e.runGPU6(name)...); err != nil {
		t.Errorf("%s run of GPU 6 after the first container went: %v\n%s", e.name, err, out)
		return
	}
	id := e.lastCreated(t)
	forgetContainer(t, id, e.root)
	owner := r.owner(t, id, e.root)
	r.expectHeld(t, owner, 6, initPid(t, e.root, id))
	expectDevice(t, e.root, id, 6)
	if out, err := e.output(ctx, "rm", "-f", name); err != nil {
		t.Errorf("%s rm: %v\n%s", e.name, err, out)
	}
	r.waitUnlocked(t, owner)
	r.expectReleased(t, owner)
}

// TestEngineKillPoints: gpuiso-runtime killed (SIGKILL) while Podman's or
// Docker's create of a GPU container has runc create before it or
// returning, or stopped (SIGTERM) as runc create returns, never leaves the
// GPU to a dead process nor to two containers, as the conformance suite's
// sampler sees the engine's containers throughout. While runc works the
// claim is the record's, and a second container of the same engine asking
// for the GPU is refused. After a SIGTERM the engine starts the container:
// it holds the GPU and opens it, a second container is refused, and its
// removal gives everything back. After a SIGKILL Podman waits for the
// container runc created (up to its create timeout, which the test cuts
// short): it lives, holds the GPU and opens it, and a second container is
// refused; once Podman gives up and deletes it, everything is given back.
// Docker deletes the container at once: the next create gets the GPU.
// Neither engine ever asks for a foreground run.
func TestEngineKillPoints(t *testing.T) {
	engines := map[string]func(*testing.T, *rig) *killEngine{
		"podman": podmanKillEngine,
		"docker": dockerKillEngine,
	}
	for _, name := range []string{"podman", "docker"} {
		t.Run(name, func(t *testing.T) {
			r := newRig(t)
			e := engines[name](t, r)
			for _, tc := range []struct {
				name string
				at   string
				sig  syscall.Signal
			}{
				{name: "SIGKILL before runc create", at: "create before", sig: syscall.SIGKILL},
				{name: "SIGKILL as runc create returns", at: "create after", sig: syscall.SIGKILL},
				{name: "SIGTERM as runc create returns", at: "create after", sig: syscall.SIGTERM},
			} {
				t.Run(tc.name, func(t *testing.T) { engineKill(t, r, e, tc.at, tc.sig) })
			}
			for _, c := range e.commands() {
				if c[0] == "run" {
					t.Errorf("%s asked for a foreground run: %q", name, c)
				}
			}
		})
	}
}

// engineKill runs one kill point through e.
func engineKill(t *testing.T, r *rig, e *killEngine, at string, sig syscall.Signal) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The engine's containers of this test, the ones it asked to create.
	watch := watchGPUs(t, r.sim, r.state, []string{e.root}, e.created)
	e.stop.stoppedAt(t, at)
	name := fmt.Sprintf("gpuiso-enginekill-%d", time.Now().UnixNano())
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	first := e.cli(ctx, e.runGPU6(name)...)
	first.Stdout, first.Stderr = out, out
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	done, exited := make(chan error, 1), make(chan struct{})
	go func() {
		done <- first.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		first.Process.Kill()
		<-exited
	})
	output := func() string { b, _ := os.ReadFile(out.Name()); return string(b) }

	pid, err := strconv.Atoi(e.stop.await(t, "reached"))
	if err != nil {
		t.Fatal(err)
	}
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || exe != r.bin {
		t.Fatalf("runc's parent %d is %q (%v), want gpuiso-runtime %s", pid, exe, err, r.bin)
	}
	id := e.lastCreated(t)
	forgetContainer(t, id, e.root)
	owner := r.owner(t, id, e.root)
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatal(err)
	}

	if sig == syscall.SIGTERM {
		if got := e.stop.await(t, "signal"); got != "TERM" {
			t.Fatalf("runc got %q, want the SIGTERM passed on", got)
		}
		e.stop.release(t)
		if err := <-done; err != nil {
			t.Fatalf("%s run after a SIGTERM to the runtime: %v\n%s", e.name, err, output())
		}
		r.expectHeld(t, owner, 6, initPid(t, e.root, id))
		e.expectRefused(t, ctx, owner)
		if out, err := e.output(ctx, "exec", name, "/probe", "open", "/dev/nvidia6"); err != nil || !testenv.Opened(lineSet(out), "/dev/nvidia6") {
			t.Errorf("%s exec: /dev/nvidia6 in the first container: %v\n%s", e.name, err, out)
		}
		watch.expectSeen(t, 1)
		if out, err := e.output(ctx, "rm", "-f", name); err != nil {
			t.Errorf("%s rm: %v\n%s", e.name, err, out)
		}
		r.waitUnlocked(t, owner)
		r.expectReleased(t, owner)
		return
	}

	// SIGKILL: runc still works, the claim is the record's.
	e.expectRefused(t, ctx, owner)
	r.expectHeld(t, owner, 6, 0)
	if !e.firstLives {
		// The engine gives up, and deletes what it began, before runc is
		// let go.
		if err := <-done; err == nil {
			t.Errorf("%s run succeeded with its runtime killed:\n%s", e.name, output())
		}
		e.stop.release(t)
		r.waitUnlocked(t, owner)
		if _, err := exec.Command("runc", "--root", e.root, "state", id).CombinedOutput(); err == nil {
			t.Fatalf("%s deleted nothing: runc has %s", e.name, id)
		}
		// The next create settles the record: the container is gone.
		e.expectGiven(t, ctx, r)
		r.expectReleased(t, owner)
		return
	}
	e.stop.release(t)
	r.waitUnlocked(t, owner)
	// The container runc created lives, and the engine waits for it. The
	// next create settles the record: held by its init.
	e.expectRefused(t, ctx, owner)
	init := initPid(t, e.root, id)
	r.expectHeld(t, owner, 6, init)
	expectDevice(t, e.root, id, 6)
	watch.expectSeen(t, 1)
	select {
	case err := <-done:
		t.Fatalf("%s run returned while the container lives: %v\n%s", e.name, err, output())
	default:
	}
	// Podman reads the container's standard error until its create
	// timeout (4 minutes): a line there ends the wait.
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/2", init), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(f, "gpuiso test: the runtime was killed")
	f.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("%s run succeeded with its runtime killed:\n%s", e.name, output())
		}
	case <-ctx.Done():
		t.Fatalf("%s run does not end: %s", e.name, output())
	}
	r.waitUnlocked(t, owner)
	r.expectReleased(t, owner)
	if _, err := exec.Command("runc", "--root", e.root, "state", id).CombinedOutput(); err == nil {
		t.Errorf("%s deleted nothing: runc has %s", e.name, id)
	}
}

// lineSet is the set of out's lines, trimmed.
func lineSet(out string) map[string]bool {
	lines := map[string]bool{}
	for l := range strings.Lines(out) {
		lines[strings.TrimSpace(l)] = true
	}
	return lines
}

// podmanKillEngine is Podman with the script as its runtime (--runtime);
// its runc root is runc's default.
func podmanKillEngine(t *testing.T, r *rig) *killEngine {
	podman := testenv.RequirePodman(t)
	e := &killEngine{name: "podman", root: defaultRuncRoot, calls: filepath.Join(t.TempDir(), "calls"), firstLives: true}
	e.stop = newStopper(t, "")
	script := runtimeScript(t, r, e.stop.runc, e.calls)
	e.img = testenv.BuildPodmanProbeImage(t, podman)
	e.flags = append([]string{"--network", "none", "--runtime", script}, testenv.PodmanRunFlags...)
	e.cli = func(ctx context.Context, args ...string) *exec.Cmd { return exec.CommandContext(ctx, podman, args...) }
	t.Cleanup(func() {
		// Every container of the test (Podman removes the runc containers).
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, _ := testenv.RunPodman(ctx, podman, "ps", "-a", "--filter", "name=^gpuiso-enginekill-", "--format", "{{.Names}}")
		if names := strings.Fields(out); len(names) > 0 {
			testenv.RunPodman(ctx, podman, append([]string{"rm", "-f", "-t", "0"}, names...)...)
		}
	})
	return e
}

// dockerKillEngine is a Docker daemon started for the test whose runtime
// "gpuiso" is the script.
func dockerKillEngine(t *testing.T, r *rig) *killEngine {
	e := &killEngine{name: "docker", calls: filepath.Join(t.TempDir(), "calls")}
	e.stop = newStopper(t, "")
	script := runtimeScript(t, r, e.stop.runc, e.calls)
	d, img := gpuisoDockerd(t, script, nil)
	e.img = img
	e.root = filepath.Join(d.Dir, "x", "runtime-runc", "moby")
	e.flags = []string{"--network", "none", "--runtime", "gpuiso"}
	e.cli = func(ctx context.Context, args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, "docker", append([]string{"-H", d.Host}, args...)...)
	}
	return e
}
