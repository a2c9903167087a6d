package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// TestOwnerOf: a container's owner names its id and its runc root: the same
// id in two roots gives two owners, one root spelled through a symlink
// gives one, and an id no owner can carry is refused as invalid.
func TestOwnerOf(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	a, err := ownerOf("c1", resolvePath(filepath.Join(real, "runc")))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ownerOf("c1", resolvePath(filepath.Join(link, "runc")))
	c, _ := ownerOf("c1", resolvePath(filepath.Join(dir, "other")))
	if a != b {
		t.Errorf("one root through a symlink: owners %q and %q", a, b)
	}
	if a == c {
		t.Errorf("two roots: both owners %q", a)
	}
	if !strings.HasPrefix(a, "c1.") || len(a) != len("c1.")+12 {
		t.Errorf("owner %q: want c1.<12 hex digits>", a)
	}
	if _, err := ownerOf("a+b", "/run/runc"); !errors.Is(err, node.ErrInvalid) {
		t.Errorf("id a+b: %v, want an invalid id", err)
	}
	if _, err := ownerOf(strings.Repeat("x", node.MaxOwnerLen-12), "/run/runc"); !errors.Is(err, node.ErrInvalid) {
		t.Errorf("long id: %v, want an invalid id", err)
	}
}

// TestRuncRoot: the runc root is --root's value wherever it stands among
// runc's global flags, and runc's default without one; a flag's value that
// reads "--root" is a value.
func TestRuncRoot(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{name: "default", want: defaultRuncRoot},
		{name: "root", args: []string{"--debug", "--root", "/x/y", "--systemd-cgroup"}, want: "/x/y"},
		{name: "root=", args: []string{"--root=/x/z"}, want: "/x/z"},
		{name: "last wins", args: []string{"--root", "/a", "--root", "/b"}, want: "/b"},
		{name: "value", args: []string{"--log", "--root", "--log-format", "json"}, want: defaultRuncRoot},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, want := (Settings{RuncArgs: tc.args}).runcRoot(), resolvePath(tc.want); got != want {
				t.Errorf("root %q, want %q", got, want)
			}
		})
	}
}

// TestRecordCorrupt: a record reads back as written; one that does not
// (a flipped byte, another version, another owner's, a created record
// without its init) is refused as corrupt.
func TestRecordCorrupt(t *testing.T) {
	rs := records{dir: filepath.Join(t.TempDir(), recordsDir), index: t.TempDir()}
	rec := ctrRecord{Owner: "c1.000000000000", ID: "c1", Root: "/run/runc", Runc: "/usr/bin/runc", Bundle: "/b", Phase: phaseCreating}
	if err := rs.write(rec); err != nil {
		t.Fatal(err)
	}
	got, err := rs.read(rec.Owner)
	if err != nil || got.ID != "c1" || got.Phase != phaseCreating {
		t.Fatalf("read back: %+v, %v", got, err)
	}
	good, err := os.ReadFile(rs.path(rec.Owner))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		owner string
		edit  func(string) string
	}{
		{name: "flipped", owner: rec.Owner, edit: func(s string) string { return strings.Replace(s, `"c1"`, `"c2"`, 1) }},
		{name: "version", owner: rec.Owner, edit: func(s string) string { return strings.Replace(s, `"version":2`, `"version":3`, 1) }},
		{name: "truncated", owner: rec.Owner, edit: func(s string) string { return s[:len(s)/2] }},
		{name: "another owner's", owner: "c2.000000000000", edit: func(s string) string { return s }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := parseRecord(tc.owner, []byte(tc.edit(string(good)))); !errors.Is(err, ErrCorruptRecord) || !errors.Is(err, node.ErrCorrupt) {
				t.Errorf("%v, want ErrCorruptRecord", err)
			}
		})
	}
	t.Run("created without init", func(t *testing.T) {
		r := rec
		r.Phase = phaseCreated
		r.Version, r.Sum = 1, ""
		r.Sum = r.legacySum()
		b, _ := json.Marshal(r)
		if _, err := parseRecord(r.Owner, b); !errors.Is(err, ErrCorruptRecord) {
			t.Errorf("%v, want ErrCorruptRecord", err)
		}
	})
}

// TestRecordLock: a record's lock is held by one process at a time; a
// waiter for a lock whose holder removes the record ends up holding the
// file that is there now, not the removed one.
func TestRecordLock(t *testing.T) {
	ctx := context.Background()
	rs := records{dir: filepath.Join(t.TempDir(), recordsDir), index: t.TempDir()}
	const owner = "c1.000000000000"
	held, err := rs.lock(ctx, owner, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rs.lock(ctx, owner, 0); !errors.Is(err, ErrContainerBusy) || !errors.Is(err, node.ErrUnavailable) {
		t.Fatalf("second lock: %v, want ErrContainerBusy", err)
	}
	got := make(chan *os.File, 1)
	go func() {
		f, err := rs.lock(ctx, owner, time.Minute)
		if err != nil {
			t.Error(err)
		}
		got <- f
	}()
	if err := rs.remove(owner, held); err != nil {
		t.Fatal(err)
	}
	f := <-got
	if f == nil {
		return
	}
	defer f.Close()
	a, err1 := f.Stat()
	b, err2 := os.Stat(rs.lockPath(owner))
	if err1 != nil || err2 != nil || !os.SameFile(a, b) {
		t.Errorf("the waiter holds a removed lock file (%v, %v)", err1, err2)
	}
}

// fakeStateRunc writes a runc stand-in whose "state" prints out (or, with
// fail, fails with out on stderr) and returns its path.
func fakeStateRunc(t *testing.T, out string, fail bool) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "runc")
	script := "#!/bin/sh\ncat <<'EOF'\n" + out + "\nEOF\n"
	if fail {
		script = "#!/bin/sh\ncat >&2 <<'EOF'\n" + out + "\nEOF\nexit 1\n"
	}
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// simAllocator is an allocator on a simulated 8-GPU node (no host tree)
// with its state in dir.
func simAllocator(t *testing.T, dir string) *allocator.Allocator {
	t.Helper()
	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(sim.NVML()),
		nvmlnode.WithDevRoot(empty), nvmlnode.WithProcRoot(empty), nvmlnode.WithSysRoot(empty))
	if err != nil {
		t.Fatal(err)
	}
	a, err := allocator.New(inv, allocator.WithStateDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestRecover: the records nobody holds are settled by what runc says: a
// creating record's container that lives keeps its GPU, held by its init;
// one runc does not know, or whose init is dead, gives it back and loses its
// record; a record whose lock is held, or whose container runc cannot be
// asked about, stays as it is, and so does the claim, which no ReleaseDead
// frees meanwhile.
func TestRecover(t *testing.T) {
	sleeper := exec.Command("sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleeper.Process.Kill(); sleeper.Wait() }()
	live, err := allocator.ProcessHolder("", sleeper.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	dead := allocator.Holder{Pid: sleeper.Process.Pid, Start: live.Start + 1}
	running := `{"pid": ` + strconv.Itoa(sleeper.Process.Pid) + `, "status": "running", "bundle": "/b"}`
	for _, tc := range []struct {
		name     string
		phase    string
		init     *allocator.Holder
		runc     string
		fail     bool
		locked   bool
		wantKept bool
		wantInit *allocator.Holder
	}{
		{name: "creating, container lives", phase: phaseCreating, runc: running, wantKept: true, wantInit: &live},
		{name: "creating, created not started", phase: phaseCreating, runc: strings.Replace(running, "running", "created", 1), wantKept: true, wantInit: &live},
		{name: "creating, no container", phase: phaseCreating, runc: `time="x" level=error msg="container does not exist"`, fail: true},
		{name: "creating, stopped", phase: phaseCreating, runc: strings.Replace(running, "running", "stopped", 1)},
		{name: "creating, runc fails", phase: phaseCreating, runc: "permission denied", fail: true, wantKept: true},
		{name: "creating, being created", phase: phaseCreating, runc: running, locked: true, wantKept: true},
		{name: "created, init lives", phase: phaseCreated, init: &live, runc: "not asked", fail: true, wantKept: true, wantInit: &live},
		{name: "created, init dead", phase: phaseCreated, init: &dead, runc: "not asked", fail: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			state := t.TempDir()
			alloc := simAllocator(t, state)
			rt := &Runtime{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), IndexDir: t.TempDir()}
			rs, err := rt.recordsOf(state)
			if err != nil {
				t.Fatal(err)
			}
			const owner = "c1.000000000000"
			rec := ctrRecord{Owner: owner, ID: "c1", Root: "/run/runc", Runc: fakeStateRunc(t, tc.runc, tc.fail), Bundle: "/b", Phase: tc.phase, Init: tc.init}
			if err := rs.write(rec); err != nil {
				t.Fatal(err)
			}
			if _, err := alloc.Allocate(ctx, owner, allocator.Request{Count: 1, Holder: tc.init}); err != nil {
				t.Fatal(err)
			}
			if tc.locked {
				lock, err := rs.lock(ctx, owner, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer lock.Close()
			}
			rt.recover(ctx, alloc, rs)
			if released, err := alloc.ReleaseDead(ctx); err != nil || len(released) != 0 && tc.wantKept {
				t.Errorf("ReleaseDead released %v (%v)", released, err)
			}
			al, err := alloc.Allocation(owner)
			_, recErr := rs.read(owner)
			if !tc.wantKept {
				if !errors.Is(err, allocator.ErrUnknownOwner) || !errors.Is(recErr, os.ErrNotExist) {
					t.Errorf("allocation %+v (%v), record: %v; want both gone", al, err, recErr)
				}
				if _, err := os.Stat(rs.lockPath(owner)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("lock file: %v, want it gone", err)
				}
				return
			}
			if err != nil || len(al.Devices) != 1 || recErr != nil {
				t.Fatalf("allocation %+v (%v), record: %v; want both kept", al, err, recErr)
			}
			switch {
			case tc.wantInit == nil && al.Holder != nil:
				t.Errorf("holder %+v, want none", *al.Holder)
			case tc.wantInit != nil && (al.Holder == nil || *al.Holder != *tc.wantInit):
				t.Errorf("holder %v, want %+v", al.Holder, *tc.wantInit)
			}
			if got, _ := rs.read(owner); tc.wantInit != nil && got.Phase != phaseCreated {
				t.Errorf("record phase %q, want %q", got.Phase, phaseCreated)
			}
		})
	}
}

// asNobody runs argv as the user nobody (uid and gid 65534, no groups, no
// capabilities) and returns its combined output and error.
func asNobody(t *testing.T, argv ...string) (string, error) {
	t.Helper()
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skipf("no setpriv: %v", err)
	}
	args := append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--"}, argv...)
	out, err := exec.Command(setpriv, args...).CombinedOutput()
	return string(out), err
}

// TestRecordsPrivate: the records, the index and the lock files are out
// of other users' reach: a nobody process can neither list the
// directories, nor read a record or an index entry, nor open a lock file
// to take its lock. Directories an earlier release left listable, and a
// lock file left readable, are made private; a directory of another user
// is refused, and nothing is written into it.
func TestRecordsPrivate(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	// Every directory above the records may be entered by anyone: only
	// the runtime's own modes keep nobody out. (The test's temporary
	// directory may be under one that nobody cannot enter.)
	base, err := os.MkdirTemp("/tmp", "gpuiso-records-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	state, index := filepath.Join(base, "state"), filepath.Join(base, "index")
	rs := records{dir: filepath.Join(state, recordsDir), index: index}
	const owner = "c1.000000000000"
	// As an earlier release, or an operator, left them.
	for _, d := range []string{rs.dir, rs.index} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(rs.lockPath(owner), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	lock, err := rs.lock(ctx, owner, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	rec := ctrRecord{Owner: owner, ID: "c1", Root: "/run/runc", Runc: "/usr/bin/runc", Bundle: "/b", Phase: phaseCreating}
	if err := rs.writeIndex(owner); err != nil {
		t.Fatal(err)
	}
	if err := rs.write(rec); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what string
		argv []string
	}{
		{"list the records", []string{"ls", rs.dir}},
		{"list the index", []string{"ls", rs.index}},
		{"read a record", []string{"cat", rs.path(owner)}},
		{"read an index entry", []string{"cat", filepath.Join(rs.index, owner+".json")}},
		{"open a lock file", []string{"sh", "-c", `exec 3<"$1"`, "sh", rs.lockPath(owner)}},
	} {
		if out, err := asNobody(t, c.argv...); err == nil {
			t.Errorf("nobody can %s: %s", c.what, out)
		}
	}
	for _, p := range []string{rs.dir, rs.index} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v, %v; want a 0700 directory", p, fi.Mode(), err)
		}
	}
	if fi, err := os.Stat(rs.lockPath(owner)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("lock file: %v, %v; want 0600", fi.Mode(), err)
	}

	t.Run("another user's directory", func(t *testing.T) {
		theirs := records{dir: filepath.Join(base, "theirs", recordsDir), index: filepath.Join(base, "theirs-index")}
		if err := os.MkdirAll(theirs.dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(theirs.dir, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if f, err := theirs.lock(ctx, owner, 0); !errors.Is(err, ErrStrangerDir) || !strings.Contains(refusal(err), "uid 65534") {
			if f != nil {
				f.Close()
			}
			t.Errorf("lock in nobody's directory: %v, want ErrStrangerDir", err)
		}
		if err := theirs.write(rec); !errors.Is(err, ErrStrangerDir) {
			t.Errorf("record in nobody's directory: %v, want ErrStrangerDir", err)
		}
		if entries, _ := os.ReadDir(theirs.dir); len(entries) != 0 {
			t.Errorf("written into nobody's directory: %v", entries)
		}
	})
}
