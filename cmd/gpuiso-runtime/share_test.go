package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/mps"
)

// addEnv appends env to the process environment of bundle dir.
func addEnv(t *testing.T, dir string, env ...string) {
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
	proc := spec["process"].(map[string]any)
	for _, e := range env {
		proc["env"] = append(proc["env"].([]any), e)
	}
	if raw, err = json.Marshal(spec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

// shareBundle is a sleeping probe's bundle asking for a memory share of
// mib MiB of any GPU (GPUISO_GPU_MEMORY).
func shareBundle(t *testing.T, probe string, mib int) string {
	t.Helper()
	dir := sleepBundle(t, probe, "all")
	addEnv(t, dir, fmt.Sprintf("GPUISO_GPU_MEMORY=%dMiB", mib))
	return dir
}

// daemonOf returns owner's MPS daemon in state directory state, and
// whether it has one.
func daemonOf(t *testing.T, state, owner string) (mps.Daemon, bool) {
	t.Helper()
	list, err := mps.Daemons(context.Background(), filepath.Join(state, daemonsDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range list {
		if d.Owner == owner {
			return d, true
		}
	}
	return mps.Daemon{}, false
}

// expectShare checks what the container whose init is pid has of the MPS
// daemon d of its share of mib MiB, seen from the host through the
// container's root: its /tmp/nvidia-mps is d's pipe directory (d's process
// holds the control lock there), and the daemon reached there holds the
// share's memory limit as its default (get_default_device_pinned_mem_limit).
func expectShare(t *testing.T, pid int, d mps.Daemon, mib uint64) {
	t.Helper()
	if !d.Alive || d.Limits.MemoryBytes != mib<<20 {
		t.Errorf("daemon of %s: alive %v, limits %+v; want a running daemon of %d MiB", d.Owner, d.Alive, d.Limits, mib)
	}
	pipe := fmt.Sprintf("/proc/%d/root/tmp/nvidia-mps", pid)
	if holder, err := linux.LockHolder(filepath.Join(pipe, "control_lock")); err != nil || holder != d.Pid {
		t.Errorf("the container's /tmp/nvidia-mps: control lock held by %d (%v), want its daemon %d", holder, err, d.Pid)
	}
	bin, err := mps.Lookup("")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = []string{"CUDA_MPS_PIPE_DIRECTORY=" + pipe, "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdin = strings.NewReader("get_default_device_pinned_mem_limit 0\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("get_default_device_pinned_mem_limit through the container's pipe directory: %v: %s", err, out)
	}
	if !limitIs(strings.TrimSpace(string(out)), mib) {
		t.Errorf("the daemon in the container's pipe directory holds %q, want %d MiB", out, mib)
	}
}

// limitIs reports whether a pinned memory limit as the daemon prints it
// ("8000M", or "7G": whole GiB, rounded down) is mib MiB.
func limitIs(s string, mib uint64) bool {
	if len(s) < 2 {
		return false
	}
	n, err := strconv.ParseUint(s[:len(s)-1], 10, 64)
	if err != nil {
		return false
	}
	switch s[len(s)-1] {
	case 'M':
		return n == mib
	case 'G':
		return n<<10 <= mib && mib < (n+1)<<10
	}
	return false
}

// expectDaemonGone checks that nothing of the MPS daemon d is left: its
// directory, its process, the MPS processes that carry its mark.
func expectDaemonGone(t *testing.T, d mps.Daemon) {
	t.Helper()
	if _, err := os.Stat(d.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the directory of %s's MPS daemon is left (%v)", d.Owner, err)
	}
	if d.Pid > 0 && linux.Alive("/proc", linux.Process{Pid: d.Pid, Start: d.Start}) {
		t.Errorf("the MPS daemon %d of %s still runs", d.Pid, d.Owner)
	}
	if strays := mps.Strays("/proc", d.Mark); len(strays) > 0 {
		t.Errorf("MPS processes of %s's daemon are left: %v", d.Owner, strays)
	}
}

// expectNoDaemons checks that the state directory's mps/ holds no daemon.
func expectNoDaemons(t *testing.T, state string) {
	t.Helper()
	list, err := mps.Daemons(context.Background(), filepath.Join(state, daemonsDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range list {
		t.Errorf("MPS daemon of %s is left: %+v", d.Owner, d)
	}
}

// containerSees runs the probe in container id of root: the share's
// environment and the names in its /tmp/nvidia-mps.
func containerSees(t *testing.T, root, id string) string {
	t.Helper()
	out, err := exec.Command("runc", "--root", root, "exec", id, "/probe", "do", "env",
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_PIPE_DIRECTORY", "NVIDIA_VISIBLE_DEVICES", "--", "ls", "/tmp/nvidia-mps").CombinedOutput()
	if err != nil {
		t.Fatalf("runc exec %s: %v: %s", id, err, out)
	}
	return string(out)
}

// newShareRig is newRig for memory shares: the MPS control daemon too.
func newShareRig(t *testing.T) *rig {
	t.Helper()
	testenv.RequireSimulatedMPS(t)
	r := newRig(t)
	stopDaemonsAtEnd(t, r.state)
	return r
}

// stopDaemonsAtEnd stops, when t ends (after the cleanups registered
// later: its containers' deletes), every MPS daemon that a failed test
// left in state directory state.
func stopDaemonsAtEnd(t *testing.T, state string) {
	t.Cleanup(func() {
		dir := filepath.Join(state, daemonsDir)
		if _, err := os.Stat(dir); err != nil {
			return
		}
		m, err := mps.New(dir)
		if err != nil {
			t.Errorf("stop the daemons left: %v", err)
			return
		}
		defer m.Close()
		if _, err := m.Sweep(context.Background(), nil); err != nil {
			t.Errorf("stop the daemons left: %v", err)
		}
	})
}

// TestShareRunc: a container asking for a memory share (GPUISO_GPU_MEMORY)
// gets a share of one GPU, held by an MPS daemon of its own that runc's
// create finds running: the container's /tmp/nvidia-mps is that daemon's
// pipe directory, its environment states the limit, and the daemon holds
// it; a second share packs onto the same GPU with a daemon of its own, a
// share that fits nowhere is refused in one line naming each GPU's free
// memory; a daemon killed while its container lives is started again in
// place by the next create or delete; delete stops the daemon and gives
// the share back.
func TestShareRunc(t *testing.T) {
	r := newShareRig(t)
	id := fmt.Sprintf("gpuiso-share-%d", time.Now().UnixNano())
	a, b := r.owner(t, id, r.root), r.owner(t, id+"-b", r.root)
	r.forget(t, id, r.root)
	r.forget(t, id+"-b", r.root)
	if out, err := r.run(t, r.root, "create", "--bundle", shareBundle(t, r.probe, 8000), id); err != nil {
		t.Fatalf("create: %v\n%s", err, out)
	}
	if out, err := r.run(t, r.root, "create", "--bundle", shareBundle(t, r.probe, 8000), id+"-b"); err != nil {
		t.Fatalf("create of a second share: %v\n%s", err, out)
	}
	got := owners(t, r.state)
	if len(got[a]) != 1 || len(got[b]) != 1 || got[a][0] != got[b][0] {
		t.Fatalf("owners %v: want %s and %s sharing one GPU", got, a, b)
	}
	gpu := got[a][0]
	da, ok := daemonOf(t, r.state, a)
	db, okb := daemonOf(t, r.state, b)
	if !ok || !okb || da.Pid == db.Pid || da.PipeDir == db.PipeDir {
		t.Fatalf("daemons %+v and %+v: want one each", da, db)
	}
	expectShare(t, initPid(t, r.root, id), da, 8000)
	expectShare(t, initPid(t, r.root, id+"-b"), db, 8000)
	expectHolder(t, r.state, a, initPid(t, r.root, id))
	sees := containerSees(t, r.root, id)
	for _, want := range []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8000M", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "control"} {
		if !strings.Contains(sees, want+"\n") {
			t.Errorf("the container sees no %q:\n%s", want, sees)
		}
	}
	expectDevice(t, r.root, id, gpu)

	// 16384 MiB per GPU: 8000 more fits on another GPU, 16385 on none.
	out, err := r.run(t, r.root, "create", "--bundle", shareBundle(t, r.probe, 16385), id+"-c")
	r.forget(t, id+"-c", r.root)
	// That is no request this node can ever meet (an invalid request, not
	// a lack of room now), said in one line that names the largest GPU.
	if err == nil || strings.Count(out, "\n") != 1 || !strings.Contains(out, "more than any shareable GPU has (the most: 16 GiB)") || !strings.Contains(out, "invalid request") {
		t.Errorf("create of a share larger than any GPU: %v\n%s", err, out)
	}

	// The daemon of a living container is killed: the next delete (of
	// another container) starts it again, in the directories the
	// container has mounted.
	if err := syscall.Kill(da.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for linux.Alive("/proc", linux.Process{Pid: da.Pid, Start: da.Start}) {
		time.Sleep(10 * time.Millisecond)
	}
	if out, err := r.run(t, r.root, "delete", "--force", id+"-b"); err != nil {
		t.Fatalf("delete: %v\n%s", err, out)
	}
	r.expectReleased(t, b)
	expectDaemonGone(t, db)
	again, ok := daemonOf(t, r.state, a)
	if !ok || again.Pid == da.Pid || again.PipeDir != da.PipeDir {
		t.Fatalf("daemon of %s after it was killed: %+v (was %d)", a, again, da.Pid)
	}
	expectShare(t, initPid(t, r.root, id), again, 8000)

	if out, err := r.run(t, r.root, "delete", "--force", id); err != nil {
		t.Fatalf("delete: %v\n%s", err, out)
	}
	r.expectReleased(t, a)
	expectDaemonGone(t, again)
	expectNoDaemons(t, r.state)
}

// TestShareKill: gpuiso-runtime killed (SIGKILL) at any point of a share's
// life leaves neither the share nor its MPS daemon behind, and never takes
// them from a container that lives: killed before runc create, the daemon
// runs on for the container runc makes (the next create finds it held by
// the container's init, and the container reaches its daemon), or is
// stopped with the share given back when runc made nothing; a container
// that died undeleted gives both back at the next create; killed as runc
// delete returns, the next create stops the daemon.
func TestShareKill(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   string
		// before runs while the stopping runc waits, gpuiso-runtime
		// killed; lives says whether runc then makes the container.
		before func(t *testing.T, r *rig, bundle string)
		lives  bool
	}{
		{name: "before runc create", at: "create before", lives: true},
		{name: "before a runc create that fails", at: "create before", before: func(t *testing.T, r *rig, bundle string) {
			if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte("{"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "as runc create returns", at: "create after", lives: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newShareRig(t)
			stop := newStopper(t, tc.at)
			id := fmt.Sprintf("gpuiso-sharekill-%d", time.Now().UnixNano())
			owner := r.owner(t, id, r.root)
			r.forget(t, id, r.root)
			bundle := shareBundle(t, r.probe, 8000)
			cmd := exec.Command(r.bin, append(r.global(r.root), "--runc", stop.runc, "create", "--bundle", bundle, id)...)
			out, err := os.Create(filepath.Join(t.TempDir(), "out"))
			if err != nil {
				t.Fatal(err)
			}
			defer out.Close()
			cmd.Stdout, cmd.Stderr = out, out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			stop.await(t, "reached")
			cmd.Process.Kill()
			cmd.Wait()
			d, ok := daemonOf(t, r.state, owner)
			if !ok || !d.Alive {
				t.Fatalf("no running MPS daemon of %s while runc works: %+v", owner, d)
			}
			gpu := owners(t, r.state)[owner]
			if len(gpu) != 1 {
				t.Fatalf("owners %v: want %s holding a share", owners(t, r.state), owner)
			}
			r.expectHeld(t, owner, gpu[0], 0)
			if tc.before != nil {
				tc.before(t, r, bundle)
			}
			stop.release(t)
			r.waitUnlocked(t, owner)
			// The next create settles the record.
			next := id + "-n"
			r.forget(t, next, r.root)
			if out, err := r.run(t, r.root, "create", "--bundle", shareBundle(t, r.probe, 1024), next); err != nil {
				t.Fatalf("create: %v\n%s", err, out)
			}
			if !tc.lives {
				r.expectReleased(t, owner)
				expectDaemonGone(t, d)
			} else {
				pid := initPid(t, r.root, id)
				expectHolder(t, r.state, owner, pid)
				now, _ := daemonOf(t, r.state, owner)
				if now.Pid != d.Pid {
					t.Errorf("daemon %d, want the one started before the kill (%d)", now.Pid, d.Pid)
				}
				expectShare(t, pid, now, 8000)
				// The container dies, undeleted: the next create gives
				// its share and daemon back.
				if out, err := exec.Command("runc", "--root", r.root, "kill", id, "KILL").CombinedOutput(); err != nil {
					t.Fatalf("runc kill: %v: %s", err, out)
				}
				waitStopped(t, r.root, id)
				third := id + "-t"
				r.forget(t, third, r.root)
				if out, err := r.run(t, r.root, "create", "--bundle", shareBundle(t, r.probe, 1024), third); err != nil {
					t.Fatalf("create: %v\n%s", err, out)
				}
				r.expectReleased(t, owner)
				expectDaemonGone(t, d)
				if out, err := r.run(t, r.root, "delete", "--force", third); err != nil {
					t.Fatalf("delete: %v\n%s", err, out)
				}
			}
			if out, err := r.run(t, r.root, "delete", "--force", next); err != nil {
				t.Fatalf("delete: %v\n%s", err, out)
			}
			if got := owners(t, r.state); len(got) != 0 {
				t.Errorf("owners %v left", got)
			}
			expectNoDaemons(t, r.state)
		})
	}
	t.Run("as runc delete returns", func(t *testing.T) {
		r := newShareRig(t)
		id := fmt.Sprintf("gpuiso-sharedel-%d", time.Now().UnixNano())
		owner := r.owner(t, id, r.root)
		r.forget(t, id, r.root)
		if out, err := r.run(t, r.root, "create", "--bundle", shareBundle(t, r.probe, 8000), id); err != nil {
			t.Fatalf("create: %v\n%s", err, out)
		}
		d, ok := daemonOf(t, r.state, owner)
		if !ok {
			t.Fatalf("no MPS daemon of %s", owner)
		}
		stop := newStopper(t, "delete after")
		cmd := exec.Command(r.bin, append(r.global(r.root), "--runc", stop.runc, "delete", "--force", id)...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		stop.await(t, "reached")
		cmd.Process.Kill()
		cmd.Wait()
		stop.release(t)
		if _, ok := daemonOf(t, r.state, owner); !ok {
			t.Fatalf("the daemon of %s went with a killed delete: nothing to recover", owner)
		}
		next := id + "-n"
		r.forget(t, next, r.root)
		if out, err := r.run(t, r.root, "create", "--bundle", shareBundle(t, r.probe, 1024), next); err != nil {
			t.Fatalf("create: %v\n%s", err, out)
		}
		r.expectReleased(t, owner)
		expectDaemonGone(t, d)
		if out, err := r.run(t, r.root, "delete", "--force", next); err != nil {
			t.Fatalf("delete: %v\n%s", err, out)
		}
		expectNoDaemons(t, r.state)
	})
}

// expectHolder checks that owner's claim is held by the container's init
// pid, with a use of the driver volume.
func expectHolder(t *testing.T, state, owner string, pid int) {
	t.Helper()
	if h := holders(t, state)[owner]; h == nil || h.Pid != pid {
		t.Errorf("%s held by %v, want the container's init %d", owner, h, pid)
	}
	if !usesVolume(context.Background(), owner) {
		t.Errorf("%s does not use the driver volume", owner)
	}
}

// waitStopped waits, at most 30 s, until runc reports container id of root
// stopped.
func waitStopped(t *testing.T, root, id string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := runcState(context.Background(), "runc", root, id)
		if err == nil && st.Status == "stopped" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s does not stop: %+v, %v", id, st, err)
		}
	}
}
