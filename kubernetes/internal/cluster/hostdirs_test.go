package cluster

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestHostDirs: the mount points a cluster makes on the host are recorded
// and removed by the last cluster to stop, never while another cluster's
// directory exists, and never one the host had.
func TestHostDirs(t *testing.T) {
	tests := []struct {
		name        string
		had         string // the part of the host tree that existed
		other       bool   // another cluster's directory is there
		wantRemoved bool
	}{
		{"last cluster", "host", false, true},
		{"another cluster runs", "host", true, false},
		{"the host had them", "host/a/b", false, false},
		{"another program filled it", "host", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmp := t.TempDir()
			parent := filepath.Join(tmp, "parent")
			for _, d := range []string{parent, filepath.Join(tmp, tt.had)} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if tt.other {
				if err := os.Mkdir(filepath.Join(parent, "k8s-other"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			dir := filepath.Join(tmp, "host", "a", "b")
			if err := makeHostDir(parent, dir); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(dir); err != nil {
				t.Fatal(err)
			}
			if tt.name == "another program filled it" {
				if err := os.WriteFile(filepath.Join(dir, "spec.json"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			made := madeHostDirs(parent)
			if tt.had == "host" && !slices.Equal(made, []string{dir, filepath.Dir(dir)}) {
				t.Errorf("recorded %v, want %s and its parent, deepest first", made, dir)
			}
			if err := removeHostDirs(parent); err != nil {
				t.Fatal(err)
			}
			_, err := os.Stat(filepath.Join(tmp, "host", "a"))
			if removed := os.IsNotExist(err); removed != tt.wantRemoved {
				t.Errorf("host/a removed: %v, want %v", removed, tt.wantRemoved)
			}
			if _, err := os.Stat(filepath.Join(tmp, "host")); err != nil {
				t.Errorf("host, which existed, is gone: %v", err)
			}
		})
	}
}
