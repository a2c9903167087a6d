package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/mps"
)

// TestShareRecoverAfterKill: an agent running a memory share is SIGKILLed;
// the share's MPS daemon runs on with its container; the restarted agent
// recovers the container with the same daemon, and once the container
// ends nothing is left: no daemon, daemon directory or allocation.
func TestShareRecoverAfterKill(t *testing.T) {
	requireCgroups(t)
	testenv.RequireSimulatedMPS(t)
	bin := buildAgent(t)
	state := filepath.Join(t.TempDir(), "state")
	mpsDir := filepath.Join(state, "mps")
	t.Cleanup(func() { // what a failure left
		if ds, _ := mps.Daemons(context.Background(), mpsDir); len(ds) > 0 {
			for _, d := range ds {
				syscall.Kill(d.Pid, syscall.SIGKILL)
			}
		}
	})
	done := filepath.Join(t.TempDir(), "done")
	first := exec.Command(bin, "--simulate", "dgx1-volta", "--gpu-memory", "2GiB", "--state-dir", state, "--",
		"sh", "-c", `echo "pipe $CUDA_MPS_PIPE_DIRECTORY"; while [ ! -e `+done+` ]; do sleep 0.02; done`)
	// A file, not a pipe: the container outlives the agent's Wait.
	outFile, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer outFile.Close()
	first.Stdout = outFile
	firstErr, err := first.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { first.Process.Kill(); first.Wait() })
	started := waitFor(t, lines(firstErr), "agent: container ")
	id := strings.TrimSuffix(strings.Fields(started)[2], ":")
	ds, err := mps.Daemons(context.Background(), mpsDir)
	if err != nil || len(ds) != 1 || ds[0].Owner != id || !ds[0].Alive || ds[0].Limits.MemoryBytes != 2<<30 {
		t.Fatalf("daemons %+v, %v", ds, err)
	}
	daemon := ds[0]

	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.Wait()
	if !linux.Alive("", linux.Process{Pid: daemon.Pid, Start: daemon.Start}) {
		t.Fatal("the share's daemon died with the agent, under its running container")
	}

	second := exec.Command(bin, "--simulate", "dgx1-volta", "--state-dir", state)
	secondErr, err := second.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Process.Kill(); second.Wait() })
	waitFor(t, lines(secondErr), "agent: recovered container "+id)
	if ds, _ := mps.Daemons(context.Background(), mpsDir); len(ds) != 1 || ds[0].Pid != daemon.Pid || !ds[0].Alive {
		t.Fatalf("after recovery: daemons %+v, want %d running", ds, daemon.Pid)
	}
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := second.Wait(); err != nil {
		t.Fatalf("restarted agent: %v", err)
	}
	if out, _ := os.ReadFile(outFile.Name()); !strings.Contains(string(out), "pipe "+isolator.MPSPipeDir) {
		t.Errorf("the container was not given its daemon's pipe directory: %q", out)
	}
	if ds, _ := mps.Daemons(context.Background(), mpsDir); len(ds) != 0 {
		t.Errorf("daemons left: %+v", ds)
	}
	if linux.Alive("", linux.Process{Pid: daemon.Pid, Start: daemon.Start}) {
		t.Error("the share's daemon runs after its container ended")
	}
	b, err := os.ReadFile(filepath.Join(state, "alloc", "allocations.json"))
	var st struct {
		State struct {
			Owners []json.RawMessage `json:"owners"`
		} `json:"state"`
	}
	if err != nil || json.Unmarshal(b, &st) != nil || len(st.State.Owners) != 0 {
		t.Errorf("allocations left (%v): %s", err, b)
	}
	noCgroups(t, state, id)
}

// TestShareReachesDaemon runs a memory share through the agent and looks
// from inside its container: CUDA_MPS_PIPE_DIRECTORY names
// isolator.MPSPipeDir, where the share's daemon's control socket is and
// answers the MPS control client with the share's compute limit; the
// container's /dev/shm is the daemon's bounded tmpfs (what the container
// writes there is in the daemon's directory, not in the host's /dev/shm),
// and neither mount reaches the host.
func TestShareReachesDaemon(t *testing.T) {
	requireCgroups(t)
	mpsBin := testenv.RequireSimulatedMPS(t)
	bin := buildAgent(t)
	state := filepath.Join(t.TempDir(), "state")
	mpsDir := filepath.Join(state, "mps")
	t.Cleanup(func() { // what a failure left
		if ds, _ := mps.Daemons(context.Background(), mpsDir); len(ds) > 0 {
			for _, d := range ds {
				syscall.Kill(d.Pid, syscall.SIGKILL)
			}
		}
	})
	done := filepath.Join(t.TempDir(), "done")
	marker := "agent-share-" + filepath.Base(filepath.Dir(done))
	script := `echo "pipe $CUDA_MPS_PIPE_DIRECTORY"
test -S ` + isolator.MPSPipeDir + `/control && echo "socket"
echo "threads $(echo get_default_active_thread_percentage | ` + mpsBin + `)"
echo "shm $(stat -f -c '%T %b %S' ` + isolator.MPSShmDir + `)"
touch ` + isolator.MPSShmDir + `/` + marker + ` && echo "ready"
while [ ! -e ` + done + ` ]; do sleep 0.02; done`
	agent := exec.Command(bin, "--simulate", "dgx1-volta", "--gpu-memory", "2GiB", "--gpu-compute", "40",
		"--state-dir", state, "--", "sh", "-c", script)
	out, err := agent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	agent.Stderr = &stderr
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agent.Process.Kill(); agent.Wait() })
	got := map[string]string{}
	for s := bufio.NewScanner(out); s.Scan(); {
		k, v, _ := strings.Cut(s.Text(), " ")
		got[k] = strings.TrimSpace(v)
		if k == "ready" {
			break
		}
	}
	if _, ok := got["ready"]; !ok {
		agent.Wait()
		t.Fatalf("the container ended early: %q; agent: %s", got, stderr.String())
	}
	ds, err := mps.Daemons(context.Background(), mpsDir)
	if err != nil || len(ds) != 1 || !ds[0].Alive {
		t.Fatalf("daemons %+v, %v", ds, err)
	}
	d := ds[0]
	if got["pipe"] != isolator.MPSPipeDir {
		t.Errorf("CUDA_MPS_PIPE_DIRECTORY %q, want %q", got["pipe"], isolator.MPSPipeDir)
	}
	if _, ok := got["socket"]; !ok {
		t.Errorf("no control socket at %s/control in the container", isolator.MPSPipeDir)
	}
	if !strings.HasPrefix(got["threads"], "40") {
		t.Errorf("the container's MPS client read the active thread percentage %q, want the share's 40", got["threads"])
	}
	if want := fmt.Sprintf("tmpfs %d 4096", mps.DefaultShmBytes/4096); got["shm"] != want {
		t.Errorf("the container's /dev/shm is %q (type, blocks, block size), want the share's %q", got["shm"], want)
	}
	if _, err := os.Stat(filepath.Join(d.ShmDir, marker)); err != nil {
		t.Errorf("what the container wrote in its /dev/shm is not in its daemon's: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", marker)); err == nil {
		os.Remove(filepath.Join("/dev/shm", marker))
		t.Error("what the container wrote in its /dev/shm is in the host's")
	}
	if _, err := os.Stat(filepath.Join(isolator.MPSPipeDir, "control")); err == nil {
		t.Errorf("the share's pipe directory is bound at %s on the host too", isolator.MPSPipeDir)
	}
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := agent.Wait(); err != nil {
		t.Fatalf("agent: %v: %s", err, stderr.String())
	}
	if ds, _ := mps.Daemons(context.Background(), mpsDir); len(ds) != 0 {
		t.Errorf("daemons left: %+v", ds)
	}
}
