package simnode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/node"
)

// TestFreeMajors: majors come from the ranges reserved for local use,
// never one the host's /proc/devices lists as a character device, whatever
// its name; block majors do not count.
func TestFreeMajors(t *testing.T) {
	inline := func(t *testing.T, body string) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "devices"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	taken := func(from, to int) string {
		var b strings.Builder
		for m := from; m <= to; m++ {
			fmt.Fprintf(&b, "%3d local%d\n", m, m)
		}
		return b.String()
	}
	for _, tc := range []struct {
		name     string
		procRoot func(t *testing.T) string
		n        int
		want     []uint32
	}{
		// A node with NVIDIA's, NVSwitch's and InfiniBand's drivers loaded
		// (driver 580, Ubuntu 24.04): 240-254 are all taken.
		{"h200 driver 580", func(*testing.T) string { return filepath.Join("testdata", "procdevices", "h200-driver-580") }, 3, []uint32{60, 61, 62}},
		// 245 is listed under a name that an earlier line has too; 253
		// and 254 are block majors only.
		{"names repeat, block majors", func(t *testing.T) string {
			return inline(t, "Character devices:\n"+taken(60, 63)+taken(120, 127)+taken(240, 244)+
				"231 infiniband_mad\n245 infiniband_mad\n"+taken(246, 252)+"\nBlock devices:\n253 zram\n254 virtblk\n")
		}, 2, []uint32{253, 254}},
		{"this host", func(*testing.T) string { return node.DefaultProcRoot }, 3, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.procRoot(t)
			got, err := freeMajors(dir, tc.n)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want != nil && !slices.Equal(got, tc.want) {
				t.Errorf("freeMajors = %v, want %v", got, tc.want)
			}
			used, err := charMajors(filepath.Join(dir, "devices"))
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range got {
				if used[m] {
					t.Errorf("major %d is listed in %s/devices", m, dir)
				}
			}
		})
	}
	full := inline(t, "Character devices:\n"+taken(60, 63)+taken(120, 127)+taken(240, 253)+"\nBlock devices:\n254 virtblk\n")
	if got, err := freeMajors(full, 2); !errors.Is(err, node.ErrInsufficient) || !strings.Contains(err.Error(), "60-63, 120-127, 240-254 has 1") {
		t.Errorf("freeMajors with one free major = %v, %v; want ErrInsufficient naming the ranges", got, err)
	}
}

// userDir is a directory of the user's: a note at the top and a file in
// its own dev, proc and sys.
func userDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, p := range []string{"notes.txt", "dev/keep", "proc/keep", "sys/keep"} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte("mine\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// checkUntouched: dir holds exactly what userDir put there.
func checkUntouched(t *testing.T, dir string) {
	t.Helper()
	var got []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			got = append(got, rel)
		}
		return nil
	})
	if want := []string{"dev/keep", "notes.txt", "proc/keep", "sys/keep"}; !slices.Equal(got, want) {
		t.Errorf("%s now holds %v, want the user's %v", dir, got, want)
	}
}

// TestUserDirRefused: a directory holding files gpuiso did not make is
// refused by MakeHost, OpenHost and Remove with one line naming it, and
// keeps every file; an empty directory is not refused. No root needed:
// the refusal comes before anything is made.
func TestUserDirRefused(t *testing.T) {
	sim, err := New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"", "dev"} {
		dir := userDir(t)
		if sub == "dev" { // only a dev of the user's, nothing else
			os.Remove(filepath.Join(dir, "notes.txt"))
			os.RemoveAll(filepath.Join(dir, "proc"))
			os.RemoveAll(filepath.Join(dir, "sys"))
		}
		calls := map[string]func() error{
			"MakeHost": func() error { _, err := sim.MakeHost(dir); return err },
			"OpenHost": func() error { _, err := sim.OpenHost(context.Background(), dir); return err },
			"Remove":   func() error { return hostAt(dir).Remove() },
		}
		for name, call := range calls {
			err := call()
			var owned *NotOwnedError
			if !errors.Is(err, ErrNotOwned) || !errors.Is(err, node.ErrExists) || !errors.As(err, &owned) || owned.Dir != dir {
				t.Errorf("%s of a user's directory = %v, want a NotOwnedError naming it", name, err)
			} else if strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "not made by gpuiso") {
				t.Errorf("%s: %q is not one clear line", name, err)
			}
		}
		if sub == "" {
			checkUntouched(t, dir)
		} else if b, err := os.ReadFile(filepath.Join(dir, "dev", "keep")); err != nil || string(b) != "mine\n" {
			t.Errorf("the user's dev/keep: %q, %v", b, err)
		}
		if _, err := os.Stat(filepath.Join(dir, markerName)); err == nil {
			t.Error("a user's directory was marked as gpuiso's")
		}
	}
	// Nothing in it: nothing to refuse, nothing to remove.
	if err := hostAt(t.TempDir()).Remove(); err != nil {
		t.Errorf("Remove of an empty directory = %v", err)
	}
}

// TestHostPathsRefused: the host's own root directory, and anything that
// resolves into its /dev, /proc or /sys, is refused before anything is
// made or removed, through a symlink too.
func TestHostPathsRefused(t *testing.T) {
	sim, err := New("pcie8")
	if err != nil {
		t.Fatal(err)
	}
	toRoot := filepath.Join(t.TempDir(), "to-root")
	if err := os.Symlink("/", toRoot); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dir string
		dev bool // also ErrRealDev
	}{
		{"/", true}, {"/.", true}, {toRoot, true}, {filepath.Join(toRoot, "dev"), true},
		{"/dev", true}, {"/proc", false}, {"/sys", false}, {"/proc/gpuiso-sim", false}, {"/sys/fs/gpuiso-sim", false},
	} {
		for name, call := range map[string]func() error{
			"MakeHost": func() error { _, err := sim.MakeHost(tc.dir); return err },
			"OpenHost": func() error { _, err := sim.OpenHost(context.Background(), tc.dir); return err },
			"Remove":   func() error { return (&Host{Root: tc.dir}).Remove() },
		} {
			err := call()
			var hp *HostPathError
			if !errors.Is(err, ErrHostPath) || !errors.Is(err, node.ErrInvalid) || !errors.As(err, &hp) || errors.Is(err, ErrRealDev) != tc.dev {
				t.Errorf("%s(%s) = %v, want a HostPathError (ErrRealDev %v)", name, tc.dir, err, tc.dev)
			}
		}
	}
	if _, err := os.Stat("/" + markerName); err == nil {
		t.Error("the host's root directory was marked")
	}
	if err := (&Host{}).Remove(); !errors.Is(err, node.ErrInvalid) {
		t.Errorf("Remove of a Host without a Root = %v, want ErrInvalid", err)
	}
}

// TestClaimableEntriesRaces: a directory listed just after another process
// marked it, or while another process removed its tree (the marker last),
// is not taken for a user's; a user's file still is.
func TestClaimableEntriesRaces(t *testing.T) {
	markedDir := t.TempDir()
	r, err := os.OpenRoot(markedDir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := mark(r); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		root    string
		listed  []string
		refused bool
	}{
		{"marker listed, gone since (a tree being removed)", t.TempDir(), []string{markerName}, false},
		{"marker and dev listed, marked since (a tree being made)", markedDir, []string{markerName, "dev"}, false},
		{"nothing listed", t.TempDir(), nil, false},
		{"a user's file", t.TempDir(), []string{"notes.txt"}, true},
		{"a user's file beside a vanished marker", t.TempDir(), []string{markerName, "notes.txt"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := claimableEntries(tc.root, tc.listed)
			if refused := errors.Is(err, ErrNotOwned); refused != tc.refused {
				t.Errorf("claimableEntries(%v) = %v, want refused %v", tc.listed, err, tc.refused)
			}
		})
	}
}
