package linux

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestOwnedPattern(t *testing.T) {
	tests := []struct {
		name  string
		owner Process
		want  string
	}{
		{"owner", Process{Pid: 42, Start: 7}, ".tmp-42.7-"},
		{"no owner", Process{}, ".tmp-"},
		{"no start time", Process{Pid: 42}, ".tmp-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := OwnedPattern(".tmp-", tt.owner); got != tt.want {
				t.Errorf("OwnedPattern = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestOwnerOfName(t *testing.T) {
	tests := []struct {
		name, in string
		want     Process
		ok       bool
	}{
		{"owned", ".tmp-42.7-123", Process{Pid: 42, Start: 7}, true},
		{"empty suffix", ".tmp-42.7-", Process{Pid: 42, Start: 7}, true},
		{"other prefix", ".new-42.7-123", Process{}, false},
		{"no owner", ".tmp-123", Process{}, false},
		{"no dash", ".tmp-42.7", Process{}, false},
		{"no start time", ".tmp-42.0-1", Process{}, false},
		{"not a process", ".tmp-a.b-1", Process{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := OwnerOfName(tt.in, ".tmp-")
			if got != tt.want || ok != tt.ok {
				t.Errorf("OwnerOfName(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestRemoveDeadOwned plants directories of a live, a dead and an unknown
// owner, a link and a file named as a dead owner's, and a link inside a
// dead owner's directory: only the dead owner's directory goes, and what
// its link points to stays.
func TestRemoveDeadOwned(t *testing.T) {
	proc := fakeProc(t, map[int]string{os.Getpid(): "R 1", 100: "S 500", 101: "Z 600"})
	parent, outside := t.TempDir(), t.TempDir()
	keep := filepath.Join(outside, "keep")
	if err := os.WriteFile(keep, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	live, err := MkdirOwned(parent, "p-", Process{Pid: 100, Start: 500})
	if err != nil {
		t.Fatal(err)
	}
	dead, err := MkdirOwned(parent, "p-", Process{Pid: 100, Start: 499})
	if err != nil {
		t.Fatal(err)
	}
	zombie, err := MkdirOwned(parent, "p-", Process{Pid: 101, Start: 600})
	if err != nil {
		t.Fatal(err)
	}
	unknown, err := MkdirOwned(parent, "p-", Process{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := MkdirOwned(parent, "q-", Process{Pid: 102, Start: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dead, "link")); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(parent, "p-102.1-link")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(parent, "p-102.1-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	got, err := RemoveDeadOwned(proc, parent, "p-")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{dead, zombie}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("removed %q, want %q", got, want)
	}
	for _, p := range []string{live, unknown, other, link, file, keep} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	for _, p := range want {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left: %v", p, err)
		}
	}
	if _, ok := OwnerOfName(filepath.Base(unknown), "p-"); ok {
		t.Errorf("directory of no owner named %s", filepath.Base(unknown))
	}

	// Without a readable proc file system nothing is provably dead.
	if got, err := RemoveDeadOwned(filepath.Join(proc, "none"), parent, "q-"); err != nil || len(got) != 0 {
		t.Errorf("without a proc root: removed %q, %v", got, err)
	}
	if got, err := RemoveDeadOwned(proc, filepath.Join(parent, "none"), "p-"); err != nil || len(got) != 0 {
		t.Errorf("missing parent: %q, %v", got, err)
	}
}

func TestRemoveDir(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	link := filepath.Join(dir, "link")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	if err := RemoveDir(link); !errors.Is(err, ErrNotDirectory) {
		t.Errorf("RemoveDir(link) = %v, want ErrNotDirectory", err)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("link's target: %v", err)
	}
	if err := RemoveDir(filepath.Join(dir, "none")); err != nil {
		t.Errorf("RemoveDir(missing) = %v", err)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := RemoveDir(sub); err != nil {
		t.Errorf("RemoveDir(dir) = %v", err)
	}
}

// fakeProc writes a proc file system of the processes given as
// "<state> <start time>".
func fakeProc(t *testing.T, procs map[int]string) string {
	t.Helper()
	root := t.TempDir()
	tail := " 1 1 0 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 "
	for pid, st := range procs {
		state, start, _ := strings.Cut(st, " ")
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		stat := strconv.Itoa(pid) + " (p) " + state + tail + start + " 0"
		if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}
