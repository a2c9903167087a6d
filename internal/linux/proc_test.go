package linux

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestParseProcStat(t *testing.T) {
	tail := " 1 1 0 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 "
	tests := []struct {
		name, stat string
		want       ProcStat
		err        bool
	}{
		{"plain", "42 (sleep) S" + tail + "12345 0 0", ProcStat{'S', 12345}, false},
		{"name with spaces and parentheses", "42 (a) b) (c) Z" + tail + "777 0", ProcStat{'Z', 777}, false},
		{"no command name", "42 sleep S 1 2", ProcStat{}, true},
		{"short", "42 (sleep) S 1 2 3", ProcStat{}, true},
		{"bad start", "42 (sleep) S" + tail + "x 0", ProcStat{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseProcStat(42, []byte(tt.stat))
			if (err != nil) != tt.err || got != tt.want {
				t.Fatalf("ParseProcStat = %+v, %v; want %+v, error %v", got, err, tt.want, tt.err)
			}
		})
	}
}

func TestParseProcess(t *testing.T) {
	tests := []struct {
		in   string
		want Process
		err  bool
	}{
		{"42.12345", Process{Pid: 42, Start: 12345}, false},
		{"42", Process{}, true},
		{"0.5", Process{}, true},
		{"42.0", Process{}, true},
		{"-1.5", Process{}, true},
		{"42.x", Process{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseProcess(tt.in)
			if (err != nil) != tt.err || got != tt.want {
				t.Fatalf("ParseProcess = %+v, %v", got, err)
			}
			if err != nil && !errors.Is(err, ErrInvalidProcess) {
				t.Fatalf("error %v does not match ErrInvalidProcess", err)
			}
			if err == nil && got.String() != tt.in {
				t.Fatalf("String = %q", got.String())
			}
		})
	}
}

func TestProcessDead(t *testing.T) {
	root := t.TempDir()
	tail := " 1 1 0 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 "
	write := func(pid int, state string, start uint64) {
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		stat := strconv.Itoa(pid) + " (p) " + state + tail + strconv.FormatUint(start, 10) + " 0"
		if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(os.Getpid(), "R", 1)
	write(100, "S", 500)
	write(101, "Z", 600)
	tests := []struct {
		name        string
		p           Process
		dead, alive bool
	}{
		{"running", Process{Pid: 100, Start: 500}, false, true},
		{"pid reused", Process{Pid: 100, Start: 499}, true, false},
		{"zombie", Process{Pid: 101, Start: 600}, true, false},
		{"gone", Process{Pid: 102, Start: 1}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Dead(root, tt.p); got != tt.dead {
				t.Errorf("Dead = %v", got)
			}
			if got := Alive(root, tt.p); got != tt.alive {
				t.Errorf("Alive = %v", got)
			}
		})
	}
	for pid, gone := range map[int]bool{100: false, 101: true, 102: true} {
		if got := PidGone(root, pid); got != gone {
			t.Errorf("PidGone(%d) = %v, want %v", pid, got, gone)
		}
	}
	if PidGone(filepath.Join(root, "none"), 102) {
		t.Error("PidGone without a proc root")
	}
	// Without a readable proc root nothing is provably dead.
	if Dead(filepath.Join(root, "none"), Process{Pid: 102, Start: 1}) {
		t.Error("Dead without a proc root")
	}
	if _, err := ReadProcStat(root, 102); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadProcStat(gone) = %v", err)
	}
}

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	if err := WriteFileAtomic(p, "", []byte("one"), 0o640, nil); err != nil {
		t.Fatal(err)
	}
	refuse := errors.New("refused")
	var seen string
	err := WriteFileAtomic(p, "", []byte("two"), 0o640, func(tmp string) error {
		b, _ := os.ReadFile(tmp)
		seen = string(b)
		return refuse
	})
	if !errors.Is(err, refuse) || seen != "two" {
		t.Fatalf("refused write: %v, check saw %q", err, seen)
	}
	b, _ := os.ReadFile(p)
	fi, _ := os.Stat(p)
	if string(b) != "one" || fi.Mode().Perm() != 0o640 {
		t.Fatalf("after a refused write: %q %v, want the old content", b, fi.Mode())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
}
