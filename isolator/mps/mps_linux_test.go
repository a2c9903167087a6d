package mps_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
)

const gib = 1 << 30

// gpu is a GPU reference for daemons: without a GPU the daemon runs all
// the same (its server never starts); on a node with GPUs, whose daemon
// refuses a GPU it does not have, it names the node's first GPU.
func gpu(i int) node.DeviceRef {
	realOnce.Do(func() {
		out, err := exec.Command("nvidia-smi", "-L").Output()
		if err != nil {
			return
		}
		if m := regexp.MustCompile(`UUID: (GPU-[0-9a-f-]+)`).FindSubmatch(out); m != nil {
			realUUID = string(m[1])
		}
	})
	if realUUID != "" {
		return node.DeviceRef{Index: i, UUID: realUUID}
	}
	return node.DeviceRef{Index: i, UUID: fmt.Sprintf("GPU-0000000%d-1111-2222-3333-444444444444", i)}
}

var (
	realOnce sync.Once
	realUUID string
)

func newManager(t *testing.T) (*mps.Manager, string) {
	t.Helper()
	testenv.RequireMPS(t)
	dir := filepath.Join(t.TempDir(), "mps")
	m, err := mps.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ds, _ := m.List(context.Background())
		for _, d := range ds {
			m.Stop(context.Background(), d.Owner)
		}
		m.Close()
	})
	return m, dir
}

func environ(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// TestDaemonLife: a share's daemon runs the real control binary for its
// GPU alone, in a mount namespace where its pipe and shm directories are
// the paths its container uses, holds the limits it was given, is started
// once per owner, and is gone with its directory after Stop.
func TestDaemonLife(t *testing.T) {
	ctx := context.Background()
	m, dir := newManager(t)
	d, err := m.Start(ctx, "share-a", gpu(3), mps.Limits{MemoryBytes: gib, ComputePercent: 30})
	if err != nil {
		t.Fatal(err)
	}
	if !d.Alive || d.Pid <= 0 || d.Start == 0 || d.Mark == "" || d.GPU != gpu(3).UUID || d.Index != 3 || d.Dir != filepath.Join(dir, "share-a") {
		t.Fatalf("daemon = %+v", d)
	}
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", d.Pid))
	if strings.TrimSpace(string(comm)) != "nvidia-cuda-mps" && !strings.HasPrefix(strings.TrimSpace(string(comm)), "nvidia-cuda-mps") {
		t.Fatalf("daemon process is %q", comm)
	}
	env := environ(t, d.Pid)
	for _, want := range []string{"CUDA_VISIBLE_DEVICES=" + gpu(3).UUID, "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"} {
		if !contains(env, want) {
			t.Errorf("daemon environment lacks %s: %v", want, env)
		}
	}
	// Its own mount namespace: the pipe directory at the container's path,
	// the shm directory as its /dev/shm; ours is untouched.
	if ours, theirs := mustReadlink(t, "/proc/self/ns/mnt"), mustReadlink(t, fmt.Sprintf("/proc/%d/ns/mnt", d.Pid)); ours == theirs {
		t.Fatalf("daemon in the caller's mount namespace %s", ours)
	}
	if err := os.WriteFile(filepath.Join(d.ShmDir, "probe"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := fmt.Sprintf("/proc/%d/root", d.Pid)
	for _, p := range []string{"/dev/shm/probe", "/tmp/nvidia-mps/control", "/tmp/nvidia-mps/control_privileged"} {
		if _, err := os.Stat(root + p); err != nil {
			t.Errorf("the daemon does not see %s: %v", p, err)
		}
	}
	for _, p := range []string{"control", "control_lock"} {
		if _, err := os.Stat(filepath.Join(d.PipeDir, p)); err != nil {
			t.Errorf("pipe directory: %v", err)
		}
	}
	held, err := m.Held(ctx, "share-a")
	if err != nil || !held.MemorySet || held.MemoryMinMiB != 1024 || held.ComputePercent != 30 {
		t.Fatalf("Held = %+v, %v", held, err)
	}
	// Idempotent for the same share; another share of the owner is refused.
	again, err := m.Start(ctx, "share-a", gpu(3), mps.Limits{MemoryBytes: gib, ComputePercent: 30})
	if err != nil || again.Pid != d.Pid {
		t.Fatalf("Start again = %+v, %v", again, err)
	}
	if _, err := m.Start(ctx, "share-a", gpu(3), mps.Limits{MemoryBytes: 2 * gib}); !errors.Is(err, mps.ErrExists) || !errors.Is(err, node.ErrExists) {
		t.Fatalf("Start of other limits = %v", err)
	}
	// A second share: a daemon of its own, its own limits.
	b, err := m.Start(ctx, "share-b", gpu(3), mps.Limits{MemoryBytes: 1536 << 20})
	if err != nil || b.Pid == d.Pid || b.PipeDir == d.PipeDir {
		t.Fatalf("second share = %+v, %v", b, err)
	}
	if h, err := m.Held(ctx, "share-b"); err != nil || h.MemoryMinMiB > 1536 || h.MemoryMaxMiB < 1536 || h.ComputePercent != 100 {
		t.Fatalf("Held(share-b) = %+v, %v", h, err)
	}
	if err := m.Stop(ctx, "share-a"); err != nil {
		t.Fatal(err)
	}
	if linux.Alive("", linux.Process{Pid: d.Pid, Start: d.Start}) {
		t.Fatal("daemon runs after Stop")
	}
	if _, err := os.Stat(d.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("directory after Stop: %v", err)
	}
	if err := m.Stop(ctx, "share-a"); err != nil {
		t.Fatalf("Stop again: %v", err)
	}
	ds, err := m.List(ctx)
	if err != nil || len(ds) != 1 || ds[0].Owner != "share-b" || !ds[0].Alive {
		t.Fatalf("List = %+v, %v", ds, err)
	}
	if _, err := m.Held(ctx, "share-a"); !errors.Is(err, mps.ErrUnknownOwner) {
		t.Fatalf("Held of a stopped daemon: %v", err)
	}
}

// TestDaemonRecovery: a daemon killed with SIGKILL is found dead; Start
// brings its owner a new one; Sweep stops the daemons of owners it does not
// keep, a daemon whose starter was killed before it wrote the pid
// included, and keeps the others.
func TestDaemonRecovery(t *testing.T) {
	ctx := context.Background()
	m, dir := newManager(t)
	a, err := m.Start(ctx, "keep", gpu(0), mps.Limits{MemoryBytes: gib})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Start(ctx, "drop", gpu(1), mps.Limits{MemoryBytes: gib})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(a.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitDead(t, a.Pid, a.Start)
	ds, _ := m.List(ctx)
	if len(ds) != 2 || ds[0].Owner != "drop" || !ds[0].Alive || ds[1].Owner != "keep" || ds[1].Alive {
		t.Fatalf("List after a kill = %+v", ds)
	}
	a2, err := m.Start(ctx, "keep", gpu(0), mps.Limits{MemoryBytes: gib})
	if err != nil || a2.Pid == a.Pid || !a2.Alive {
		t.Fatalf("restart = %+v, %v", a2, err)
	}
	// A daemon whose starter died before recording its pid: its record
	// names none, its process holds the pipe directory's control lock.
	orphan := filepath.Join(dir, "orphan")
	for _, sub := range []string{"pipe", "log", "shm"} {
		if err := os.MkdirAll(filepath.Join(orphan, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rec := `{"version":1,"owner":"orphan","gpu":"` + gpu(2).UUID + `","index":2,"limits":{"memoryBytes":1073741824},"dir":"` + orphan + `"}`
	if err := os.WriteFile(filepath.Join(orphan, "daemon.json"), []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(m.Control(), "-f")
	cmd.Env = []string{"CUDA_MPS_PIPE_DIRECTORY=" + filepath.Join(orphan, "pipe"), "CUDA_MPS_LOG_DIRECTORY=" + filepath.Join(orphan, "log")}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go cmd.Wait()
	waitFile(t, filepath.Join(orphan, "pipe", "control"))
	stopped, err := m.Sweep(ctx, func(o string) bool { return o == "keep" })
	if err != nil || strings.Join(stopped, ",") != "drop,orphan" {
		t.Fatalf("Sweep = %v, %v", stopped, err)
	}
	for _, p := range []linux.Process{{Pid: b.Pid, Start: b.Start}, {Pid: cmd.Process.Pid}} {
		if p.Start == 0 {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d/stat", p.Pid)); err == nil {
				if st, _ := linux.ReadProcStat("", p.Pid); !st.Exited() {
					t.Errorf("process %d runs after Sweep", p.Pid)
				}
			}
			continue
		}
		if linux.Alive("", p) {
			t.Errorf("daemon %d runs after Sweep", p.Pid)
		}
	}
	ds, _ = m.List(ctx)
	if len(ds) != 1 || ds[0].Owner != "keep" || !ds[0].Alive || ds[0].Pid != a2.Pid {
		t.Fatalf("List after Sweep = %+v", ds)
	}
}

// TestClientCanChangeLimits records what MPS itself enforces about its
// limits, which the package's documentation builds on: a client of any
// user that reaches a daemon's control socket can raise its default memory
// limit (set_default_device_pinned_mem_limit is not privileged), while
// quit and servers of other users are refused to it.
func TestClientCanChangeLimits(t *testing.T) {
	ctx := context.Background()
	m, _ := newManager(t)
	d, err := m.Start(ctx, "tamper", gpu(0), mps.Limits{MemoryBytes: gib})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("no nsenter to enter the daemon's mount namespace")
	}
	// A client as the share's container sees the daemon: in its mount
	// namespace (the pipe directory at /tmp/nvidia-mps), as a user other
	// than root.
	nobody := func(command string) string {
		cmd := exec.Command("nsenter", "--mount=/proc/"+strconv.Itoa(d.Pid)+"/ns/mnt", "--setuid", "65534", "--setgid", "65534", "--", m.Control())
		cmd.Env = []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"}
		cmd.Stdin = strings.NewReader(command + "\n")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s as nobody: %v: %s", command, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if out := nobody("quit"); !strings.Contains(out, "privilege") {
		t.Fatalf("quit as nobody: %q", out)
	}
	out := nobody("set_default_device_pinned_mem_limit 0 8G")
	h, err := m.Held(ctx, "tamper")
	if err != nil {
		t.Fatal(err)
	}
	// The 535 daemon takes the command from any user; the 580 daemon
	// refuses it to users other than root and its own. Either way, what it
	// says and what it holds agree.
	refused := strings.Contains(out, "Insufficient privileges")
	t.Logf("a non-root client's set_default_device_pinned_mem_limit: %q; the daemon holds %+v", out, h)
	switch {
	case refused && h.MemoryMinMiB != 1<<10:
		t.Fatalf("the daemon refused a non-root client's limit (%q) but holds %+v", out, h)
	case !refused && h.MemoryMinMiB != 8<<10:
		t.Fatalf("the daemon took a non-root client's limit (%q) but holds %+v: update the package documentation", out, h)
	}
}

// TestStrays finds the MPS processes that carry one daemon's mark in a
// proc tree, and nothing else.
func TestStrays(t *testing.T) {
	proc := t.TempDir()
	mk := func(pid int, comm, env, state string) {
		d := filepath.Join(proc, strconv.Itoa(pid))
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "comm"), []byte(comm+"\n"), 0o644)
		os.WriteFile(filepath.Join(d, "environ"), []byte(strings.ReplaceAll(env, " ", "\x00")+"\x00"), 0o644)
		os.WriteFile(filepath.Join(d, "stat"), []byte(fmt.Sprintf("%d (%s) %s 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0", pid, comm, state, 100+pid)), 0o644)
	}
	mk(10, "nvidia-cuda-mps", "PATH=/bin GPUISO_MPS_DAEMON=aaa", "S")
	mk(11, "nvidia-cuda-mps-server", "GPUISO_MPS_DAEMON=aaa CUDA_VISIBLE_DEVICES=GPU-1", "S")
	mk(12, "sh", "GPUISO_MPS_DAEMON=aaa", "S")                       // not MPS's
	mk(13, "nvidia-cuda-mps-server", "GPUISO_MPS_DAEMON=bbb", "S")   // another daemon's
	mk(14, "nvidia-cuda-mps-server", "GPUISO_MPS_DAEMON=aaa", "Z")   // ended
	mk(15, "nvidia-cuda-mps-server", "GPUISO_MPS_DAEMON=aaab", "S")  // a longer mark
	mk(16, "nvidia-cuda-mps-server", "X=GPUISO_MPS_DAEMON=aaa", "S") // not the variable
	got := mps.Strays(proc, "aaa")
	if len(got) != 2 || got[0].Pid != 10 || got[1].Pid != 11 || got[1].Start != 111 {
		t.Fatalf("Strays = %+v", got)
	}
	if got := mps.Strays(proc, ""); got != nil {
		t.Fatalf("Strays of no mark = %+v", got)
	}
}

// TestInvalid: malformed requests change nothing.
func TestInvalid(t *testing.T) {
	ctx := context.Background()
	m, dir := newManager(t)
	for name, tc := range map[string]struct {
		owner string
		gpu   node.DeviceRef
		lim   mps.Limits
	}{
		"bad owner":         {"../x", gpu(0), mps.Limits{MemoryBytes: gib}},
		"no uuid":           {"o", node.DeviceRef{Index: 1}, mps.Limits{MemoryBytes: gib}},
		"MIG by its parent": {"o", node.DeviceRef{UUID: gpu(0).UUID, MIG: &node.MIGRef{ParentUUID: gpu(0).UUID}}, mps.Limits{MemoryBytes: gib}},
		"no memory":         {"o", gpu(0), mps.Limits{}},
		"compute 101":       {"o", gpu(0), mps.Limits{MemoryBytes: gib, ComputePercent: 101}},
	} {
		if _, err := m.Start(ctx, tc.owner, tc.gpu, tc.lim); !errors.Is(err, mps.ErrInvalid) || !errors.Is(err, node.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 { // the lock file
		t.Fatalf("left in %s: %v", dir, entries)
	}
	var zero mps.Manager
	if _, err := zero.Start(ctx, "o", gpu(0), mps.Limits{MemoryBytes: gib}); !errors.Is(err, mps.ErrNotMade) {
		t.Fatalf("zero Manager: %v", err)
	}
	if _, err := mps.New(t.TempDir(), mps.WithControl("relative/path")); !errors.Is(err, mps.ErrInvalid) {
		t.Fatalf("relative control: %v", err)
	}
	if _, err := mps.New(t.TempDir(), mps.WithControl("/nonexistent/nvidia-cuda-mps-control")); !errors.Is(err, mps.ErrNoControl) || !errors.Is(err, node.ErrNotSupported) {
		t.Fatalf("a control binary that is not there: %v, want ErrNoControl", err)
	}
	plain := filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := mps.New(t.TempDir(), mps.WithControl(plain)); !errors.Is(err, mps.ErrNoControl) {
		t.Fatalf("a control binary that is not executable: %v, want ErrNoControl", err)
	}
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

func mustReadlink(t *testing.T, p string) string {
	t.Helper()
	s, err := os.Readlink(p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func waitDead(t *testing.T, pid int, start uint64) {
	t.Helper()
	for i := 0; linux.Alive("", linux.Process{Pid: pid, Start: start}); i++ {
		if i > 2000 {
			t.Fatalf("process %d does not end", pid)
		}
		time.Sleep(time.Millisecond)
	}
}

func waitFile(t *testing.T, p string) {
	t.Helper()
	for i := 0; ; i++ {
		if _, err := os.Stat(p); err == nil {
			return
		}
		if i > 5000 {
			t.Fatalf("%s never appeared", p)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestRestartSparesOthers: starting a killed daemon again kills what it
// left and nothing of another daemon, even one whose namespace took the
// dead one's inode number (the kernel reuses them at once).
func TestRestartSparesOthers(t *testing.T) {
	ctx := context.Background()
	m, _ := newManager(t)
	a, err := m.Start(ctx, "a", gpu(0), mps.Limits{MemoryBytes: gib})
	if err != nil {
		t.Fatal(err)
	}
	if !contains(environ(t, a.Pid), mps.MarkEnv+"="+a.Mark) {
		t.Fatalf("the daemon's environment lacks its mark %s", a.Mark)
	}
	syscall.Kill(a.Pid, syscall.SIGKILL)
	waitDead(t, a.Pid, a.Start)
	b, err := m.Start(ctx, "b", gpu(1), mps.Limits{MemoryBytes: gib})
	if err != nil {
		t.Fatal(err)
	}
	a2, err := m.Start(ctx, "a", gpu(0), mps.Limits{MemoryBytes: gib})
	if err != nil || a2.Mark == a.Mark {
		t.Fatalf("restart = %+v, %v", a2, err)
	}
	if !linux.Alive("", linux.Process{Pid: b.Pid, Start: b.Start}) {
		t.Fatal("restarting a's daemon killed b's")
	}
}

// BenchmarkDaemon is the start of a share's daemon (its process in a mount
// namespace of its own, until it answers, its limits set and read back)
// and its stop (quit, until it has ended, its directory removed).
func BenchmarkDaemon(b *testing.B) {
	testenv.RequireMPS(b)
	ctx := context.Background()
	m, err := mps.New(filepath.Join(b.TempDir(), "mps"))
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	b.Run("op=start", func(b *testing.B) {
		for i := range b.N {
			if _, err := m.Start(ctx, fmt.Sprintf("s%d", i), gpu(0), mps.Limits{MemoryBytes: gib, ComputePercent: 50}); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		ds, _ := m.List(ctx)
		for _, d := range ds {
			m.Stop(ctx, d.Owner)
		}
	})
	b.Run("op=stop", func(b *testing.B) {
		b.StopTimer()
		for i := range b.N {
			if _, err := m.Start(ctx, fmt.Sprintf("t%d", i), gpu(0), mps.Limits{MemoryBytes: gib}); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		for i := range b.N {
			if err := m.Stop(ctx, fmt.Sprintf("t%d", i)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// mountOptions are the per-mount options of the mount at target in pid's
// mount namespace ("" when there is none).
func mountOptions(t *testing.T, pid int, target string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	opts := ""
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[4] == target {
			opts = f[5] // the last mount at target is the one seen
		}
	}
	return opts
}

// TestRestartFollowsNoLink: the pipe and shared memory directories are the
// share's container's to write, and a daemon started again in them runs
// while the container does: its root may plant links there by the names
// the daemon creates and chmods (control_lock, control, log), to host
// files (the daemon writes its log through a link named log). The daemon has both directories nosymfollow (and nosuid, nodev,
// noexec), started anew or again, and a restart raced by a planter of such
// links leaves the host files as they were, whether it starts or fails.
func TestRestartFollowsNoLink(t *testing.T) {
	ctx := context.Background()
	m, _ := newManager(t)
	lim := mps.Limits{MemoryBytes: gib}
	d, err := m.Start(ctx, "share", gpu(0), lim)
	if err != nil {
		t.Fatal(err)
	}
	check := func(d mps.Daemon) {
		t.Helper()
		for _, target := range []string{"/tmp/nvidia-mps", "/dev/shm"} {
			opts := mountOptions(t, d.Pid, target)
			for _, want := range []string{"nosuid", "nodev", "noexec", "nosymfollow"} {
				if !contains(strings.Split(opts, ","), want) {
					t.Errorf("daemon %d has %s with %q, want %s", d.Pid, target, opts, want)
				}
			}
		}
	}
	check(d)

	// Host files outside /tmp, which is a tmpfs of its own to the daemon.
	hostDir, err := os.MkdirTemp("/var/tmp", "mps-host-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(hostDir) })
	// The files the daemon opens, creates or chmods by name; links where
	// its sockets go would only fail its start.
	names := []string{"control_lock", "log"}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(hostDir, n), []byte("host"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 5 {
		syscall.Kill(d.Pid, syscall.SIGKILL)
		waitDead(t, d.Pid, d.Start)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { // the container's root, in the pipe directory it has
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, n := range names {
					os.Symlink(filepath.Join(hostDir, n), filepath.Join(d.PipeDir, n))
				}
				time.Sleep(50 * time.Microsecond)
			}
		})
		again, err := m.Start(ctx, "share", gpu(0), lim)
		close(stop)
		wg.Wait()
		for _, n := range names {
			fi, serr := os.Stat(filepath.Join(hostDir, n))
			b, _ := os.ReadFile(filepath.Join(hostDir, n))
			if serr != nil || fi.Mode() != 0o600 || string(b) != "host" {
				t.Fatalf("round %d: the host file %s behind a planted link is now %v, %q (%v)", round, n, fi.Mode(), b, serr)
			}
		}
		if err != nil {
			// Refused by a link where the daemon's file should be: the
			// share's daemon is gone, as after any failed start.
			t.Logf("round %d: restart among planted links: %v", round, err)
			entries, _ := os.ReadDir(d.PipeDir)
			for _, e := range entries {
				os.Remove(filepath.Join(d.PipeDir, e.Name()))
			}
			if again, err = m.Start(ctx, "share", gpu(0), lim); err != nil {
				t.Fatal(err)
			}
		}
		check(again)
		d = again
	}
}

// TestStartOverUnfinishedStop: a daemon's directory whose removal did not
// finish (its container wrote on in it as it went) and that has no record
// left is removed by the owner's next Start, which then starts.
func TestStartOverUnfinishedStop(t *testing.T) {
	ctx := context.Background()
	m, dir := newManager(t)
	left := filepath.Join(dir, "left", "pipe")
	if err := os.MkdirAll(left, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(left, "log")); err != nil {
		t.Fatal(err)
	}
	d, err := m.Start(ctx, "left", gpu(0), mps.Limits{MemoryBytes: gib})
	if err != nil || !d.Alive {
		t.Fatalf("Start over a directory without a record = %+v, %v", d, err)
	}
	if fi, err := os.Lstat(filepath.Join(d.PipeDir, "log")); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		t.Error("the link left in the pipe directory is still there")
	}
}

// TestRestartWithoutNoSymfollow: on a kernel that cannot bind a directory
// nosymfollow (before Linux 5.10), a new daemon starts with its
// directories bound as they are (no container has seen them yet), and a
// dead one is not started again in the directories its container may
// still write: ErrUnsafeRestart, and nothing of the share is left.
func TestRestartWithoutNoSymfollow(t *testing.T) {
	testenv.RequireMPS(t)
	ctx := context.Background()
	m, err := mps.New(filepath.Join(t.TempDir(), "mps"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	refused := 0
	mps.SetStartDaemon(m, func(cmd *exec.Cmd, mounts []linux.NamespaceMount) error {
		for _, mt := range mounts {
			if mt.Untrusted {
				refused++
				return fmt.Errorf("remount: %w: %w", unix.EINVAL, linux.ErrNotSupported)
			}
		}
		return linux.StartDaemon(cmd, mounts)
	})
	lim := mps.Limits{MemoryBytes: 1 << 30}
	d, err := m.Start(ctx, "share", gpu(0), lim)
	if err != nil || !d.Alive || refused != 1 {
		t.Fatalf("Start = %+v, %v (nosymfollow refused %d times)", d, err, refused)
	}
	linux.Kill(d.Pid)
	for linux.Alive("", linux.Process{Pid: d.Pid, Start: d.Start}) {
		time.Sleep(time.Millisecond)
	}
	_, err = m.Start(ctx, "share", gpu(0), lim)
	if !errors.Is(err, mps.ErrUnsafeRestart) || !errors.Is(err, node.ErrNotSupported) {
		t.Fatalf("Start again = %v, want ErrUnsafeRestart", err)
	}
	if _, err := os.Stat(d.Dir); !os.IsNotExist(err) {
		t.Errorf("the refused share's directory: %v, want it removed", err)
	}
	if ds, _ := m.List(ctx); len(ds) != 0 {
		t.Errorf("List after the refused restart = %+v", ds)
	}
}
