package mps_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
)

// TestServerOutOfReach: a daemon's server, started for a user's client,
// runs the namespace's execute-only copy of the driver's server, as that
// user, non-dumpable: its private /proc entries are root's and a process
// of the same uid cannot reach its root. It runs as far as the driver
// (without a GPU it ends there, a moment after it starts: the server is
// looked for while it lives, and asked for again until it is seen).
func TestServerOutOfReach(t *testing.T) {
	ctx := context.Background()
	m, _ := newManager(t)
	d, err := m.Start(ctx, "reach", gpu(0), mps.Limits{MemoryBytes: gib})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Fatal("no nsenter to enter the daemon's mount namespace")
	}
	const nobody = 65534
	copyPath := "/tmp/nvidia-mps-server/" + mps.ServerBinary
	var seen bool
	for try := 0; try < 20 && !seen; try++ {
		ask := exec.Command("nsenter", "--mount=/proc/"+strconv.Itoa(d.Pid)+"/ns/mnt", "--", m.Control())
		ask.Env = []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"}
		ask.Stdin = strings.NewReader("start_server -uid " + strconv.Itoa(nobody) + "\n")
		if out, err := ask.CombinedOutput(); err != nil {
			t.Fatalf("start_server: %v: %s", err, out)
		}
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && !seen; {
			for _, p := range mps.Strays(node.DefaultProcRoot, d.Mark) {
				if p.Pid == d.Pid {
					continue
				}
				proc := "/proc/" + strconv.Itoa(p.Pid)
				if exe, _ := os.Readlink(proc + "/exe"); exe != copyPath {
					continue // not yet the server's program
				}
				var st unix.Stat_t
				if err := unix.Stat(proc+"/environ", &st); err != nil {
					continue // ended
				}
				status, err := os.ReadFile(proc + "/status")
				if err != nil {
					continue
				}
				if !strings.Contains(string(status), "\nUid:\t"+strconv.Itoa(nobody)+"\t") {
					t.Fatalf("server %d runs as another user than its client's:\n%s", p.Pid, status)
				}
				if st.Uid != 0 {
					t.Fatalf("server %d is dumpable: its environ is uid %d's", p.Pid, st.Uid)
				}
				ls := exec.Command("ls", proc+"/root/")
				ls.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
				if out, err := ls.CombinedOutput(); err == nil {
					t.Fatalf("uid %d reached server %d's root: %s", nobody, p.Pid, out)
				}
				seen = true
				t.Logf("server %d: uid %d, non-dumpable, %s", p.Pid, nobody, copyPath)
			}
		}
	}
	if !seen {
		t.Fatal("no server was seen in 20 starts")
	}
	// The copy is the namespace's alone, execute-only, root's.
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+strconv.Itoa(d.Pid)+"/root"+copyPath, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o111 || st.Uid != 0 {
		t.Errorf("server copy: mode %o, uid %d; want 111, 0", st.Mode&0o7777, st.Uid)
	}
	if _, err := os.Stat(copyPath); err == nil {
		t.Error("the server copy is in the host's namespace")
	}
	// The server ran past its start, to the driver.
	var log []byte
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if log, _ = os.ReadFile(filepath.Join(d.LogDir, "control.log")); strings.Contains(string(log), "Initializing server process") {
			return
		}
	}
	t.Errorf("the server never initialized:\n%s", log)
}

// TestNoServer: a control daemon with no server beside it, nor in the
// directories its daemons search, starts no daemon (ErrNoServer) and leaves nothing.
func TestNoServer(t *testing.T) {
	testenv.RequireRoot(t)
	root := t.TempDir()
	ctl := filepath.Join(root, "opt", "bin", mps.ControlBinary)
	if err := os.MkdirAll(filepath.Dir(ctl), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ctl, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "mps")
	m, err := mps.New(dir, mps.WithControl(ctl), mps.WithRegistry(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	mps.SetHostRoot(m, root)
	_, err = m.Start(context.Background(), "none", gpu(0), mps.Limits{MemoryBytes: gib})
	if !errors.Is(err, mps.ErrNoServer) || !errors.Is(err, node.ErrNotSupported) {
		t.Fatalf("Start without a server: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "none")); !os.IsNotExist(err) {
		t.Errorf("a daemon's directory was made: %v", err)
	}
}
