package linux

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestStartDaemon: the daemon sees its mounts, in a session of its own; the
// caller's mount namespace keeps none of them.
func TestStartDaemon(t *testing.T) {
	if !IsRoot() {
		t.Skip("needs root: mount namespaces")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "mark"), []byte("here"), 0o644); err != nil {
		t.Fatal(err)
	}
	scratch := filepath.Join(dir, "scratch")
	// A source the tmpfs at scratch covers once mounted.
	hidden := filepath.Join(scratch, "hidden")
	if err := os.MkdirAll(hidden, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hidden, "mark"), []byte("under"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command("sh", "-c", "cat "+scratch+"/in/mark; echo; ps -o sid= -p $$; stat -c %a "+scratch+"; cat "+scratch+"/in2/mark; echo; ls "+scratch)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := StartDaemon(cmd, []NamespaceMount{{Target: scratch, Mode: 0o777 | os.ModeSticky}, {Source: src, Target: filepath.Join(scratch, "in")}, {Source: hidden, Target: filepath.Join(scratch, "in2")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	lines := strings.Fields(out.String())
	if len(lines) != 6 || lines[0] != "here" || lines[2] != "1777" || lines[3] != "under" || lines[4] != "in" || lines[5] != "in2" {
		t.Fatalf("daemon saw %q", out.String())
	}
	if own, _ := exec.Command("ps", "-o", "sid=", "-p", strconv.Itoa(os.Getpid())).Output(); lines[1] == strings.TrimSpace(string(own)) {
		t.Fatalf("daemon in the caller's session %s", lines[1])
	}
	if _, err := os.Stat(filepath.Join(scratch, "in", "mark")); err == nil {
		t.Fatal("the daemon's mount is in the caller's namespace")
	}
}

// TestLockHolder: the holder of a POSIX lock is found; no lock, no holder.
func TestLockHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if pid, err := LockHolder(path); err != nil || pid != 0 {
		t.Fatalf("unlocked: %d, %v", pid, err)
	}
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("no flock(1) to hold a lock")
	}
	// A child holds an fcntl lock: python is not everywhere, perl is.
	if _, err := exec.LookPath("perl"); err != nil {
		t.Skip("no perl to hold an fcntl lock")
	}
	cmd := exec.Command("perl", "-e", `use Fcntl; open(my $f, "+<", $ARGV[0]) or die; my $l = pack("s s l l l", F_WRLCK, 0, 0, 0, 0); fcntl($f, F_SETLKW, $l) or die "$!"; print "locked\n"; $| = 1; sleep 30;`, path)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	buf := make([]byte, 7)
	if _, err := stdout.Read(buf); err != nil || string(buf) != "locked\n" {
		t.Fatalf("perl: %q %v", buf, err)
	}
	if pid, err := LockHolder(path); err != nil || pid != cmd.Process.Pid {
		t.Fatalf("LockHolder = %d, %v, want %d", pid, err, cmd.Process.Pid)
	}
}

// TestStartDaemonKeepsMainThread: the mount namespace is never taken on
// the main thread, whose namespaces /proc/self shows for the process.
func TestStartDaemonKeepsMainThread(t *testing.T) {
	if !IsRoot() {
		t.Skip("needs root: mount namespaces")
	}
	before, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		cmd := exec.Command("true")
		if err := StartDaemon(cmd, []NamespaceMount{{Target: t.TempDir(), Mode: 0o755}}); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		if after, _ := os.Readlink("/proc/self/ns/mnt"); after != before {
			t.Fatalf("the process's mount namespace became %s (was %s)", after, before)
		}
	}
}

// TestLockHolderOpensOnlyAFile: a lock file that a container could replace
// (an MPS daemon's pipe directory is its container's) is never opened as a
// FIFO (which would block the caller, holding its locks, until a writer
// came) nor followed as a link to a host file or device.
func TestLockHolderOpensOnlyAFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "host-file")
	if err := os.WriteFile(target, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{fifo, link, filepath.Join(dir, "link-to-null")} {
		if path == filepath.Join(dir, "link-to-null") {
			if err := os.Symlink("/dev/null", path); err != nil {
				t.Fatal(err)
			}
		}
		done := make(chan error, 1)
		go func() {
			_, err := LockHolder(path)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("LockHolder(%s) opened it", filepath.Base(path))
			}
		case <-time.After(5 * time.Second):
			// Let the blocked open go, so that the test ends.
			if w, err := os.OpenFile(fifo, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
				w.Close()
			}
			t.Fatalf("LockHolder(%s) blocked", filepath.Base(path))
		}
	}
}

// TestStartDaemonUntrusted: a daemon given a directory that another party
// writes (Untrusted) follows no link planted there, so a privileged daemon
// that creates, writes or chmods a file by a name in it leaves the host
// file the link names as it was; files of the directory itself are its
// own to write, and nothing there runs or opens as a device.
func TestStartDaemonUntrusted(t *testing.T) {
	if !IsRoot() {
		t.Skip("needs root: mount namespaces")
	}
	dir := t.TempDir()
	shared, host := filepath.Join(dir, "shared"), filepath.Join(dir, "host-file")
	if err := os.Mkdir(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(host, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, filepath.Join(shared, "log")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(shared, "run"), []byte("#!/bin/sh\necho ran\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dir, "ns")
	var out bytes.Buffer
	cmd := exec.Command("sh", "-c", "chmod 777 "+target+"/log; echo daemon >> "+target+"/log; echo own > "+target+"/own; "+target+"/run; echo done")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := StartDaemon(cmd, []NamespaceMount{{Source: shared, Target: target, Untrusted: true}}); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if b, err := os.ReadFile(host); err != nil || string(b) != "host" {
		t.Errorf("the host file behind the link holds %q (%v), want it untouched", b, err)
	}
	if fi, err := os.Stat(host); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the host file behind the link: %v (%v), want mode 0600", fi.Mode(), err)
	}
	if b, err := os.ReadFile(filepath.Join(shared, "own")); err != nil || string(b) != "own\n" {
		t.Errorf("the daemon's own file: %q (%v)", b, err)
	}
	if strings.Contains(out.String(), "ran\n") || !strings.Contains(out.String(), "done") {
		t.Errorf("the daemon ran a program of the shared directory, or did not finish: %s", out.String())
	}
}

// TestStartDaemonContent: a Content mount writes a copy of the file at its
// target, of its mode, in the daemon's namespace alone; a process run as
// another user from an execute-only copy (0111) is non-dumpable: its
// private /proc entries are root's, and a process of its own uid cannot reach its
// root through /proc, where one run from a readable copy (0755) can.
func TestStartDaemonContent(t *testing.T) {
	if !IsRoot() {
		t.Skip("needs root: mount namespaces and another user's processes")
	}
	const nobody = 65534
	for _, tc := range []struct {
		mode     os.FileMode
		reached  bool
		procUser uint32
	}{{0o111, false, 0}, {0o755, true, nobody}} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			scratch := t.TempDir()
			if err := os.Chmod(filepath.Dir(scratch), 0o755); err != nil { // for the other user's exec
				t.Fatal(err)
			}
			src, err := os.Open("/bin/sleep")
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			if _, err := src.Seek(100, 0); err != nil { // the copy is read from the start whatever the offset
				t.Fatal(err)
			}
			prog := filepath.Join(scratch, "bin", "sleep")
			cmd := exec.Command(prog, "30")
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
			err = StartDaemon(cmd, []NamespaceMount{{Target: scratch, Mode: 0o755}, {Target: prog, Content: src, Mode: tc.mode}})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { cmd.Process.Kill(); cmd.Wait() }()
			if _, err := os.Stat(prog); err == nil {
				t.Fatal("the copy is in the caller's namespace")
			}
			proc := "/proc/" + strconv.Itoa(cmd.Process.Pid)
			// The program runs once its exec is done: its exe is the copy.
			deadline := time.Now().Add(10 * time.Second)
			for {
				if exe, _ := os.Readlink(proc + "/exe"); exe == prog {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s never ran %s", proc, prog)
				}
				time.Sleep(time.Millisecond)
			}
			var st unix.Stat_t
			if err := unix.Stat(proc+"/root/"+strings.TrimPrefix(prog, "/"), &st); err != nil {
				t.Fatal(err)
			}
			if os.FileMode(st.Mode).Perm() != tc.mode || st.Uid != 0 {
				t.Errorf("copy: mode %o, uid %d; want %o, 0", st.Mode&0o777, st.Uid, tc.mode)
			}
			if err := unix.Stat(proc+"/environ", &st); err != nil {
				t.Fatal(err)
			}
			if st.Uid != tc.procUser {
				t.Errorf("%s/environ is uid %d's; want %d's", proc, st.Uid, tc.procUser)
			}
			ls := exec.Command("ls", proc+"/root/")
			ls.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
			out, err := ls.CombinedOutput()
			if reached := err == nil; reached != tc.reached {
				t.Errorf("uid %d listing %s/root: %v, %s; want reached %v", nobody, proc, err, out, tc.reached)
			}
		})
	}
}

// TestEnd: End kills the process it names and waits for it; a name whose
// start time is another's (a later process given the pid) kills nothing.
func TestEnd(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer cmd.Process.Kill()
	p, err := ProcessOf("", cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	other := Process{Pid: p.Pid, Start: p.Start + 1}
	if err := End(t.Context(), "", other, time.Second); err != nil {
		t.Fatalf("End of a process that is not there: %v", err)
	}
	if !Alive("", p) {
		t.Fatal("End killed a process it did not name")
	}
	if err := End(t.Context(), "", p, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the process runs on")
	}
}
