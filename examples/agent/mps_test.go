package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
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
	if out, _ := os.ReadFile(outFile.Name()); !strings.Contains(string(out), "pipe "+daemon.PipeDir) {
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
