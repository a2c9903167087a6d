package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLegacyRecord: a record of version 1 (the container's JSON alone,
// checked in as the agent wrote it) reads as the container it records, so
// that an upgraded agent recovers what an older one left running; written
// again it is an entry of the record store with the same content. A
// temporary file a killed write left is removed.
func TestLegacyRecord(t *testing.T) {
	a := &agent{dir: t.TempDir()}
	dir := filepath.Join(a.dir, "containers")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	old, err := os.ReadFile(filepath.Join("testdata", "containers-v1", "c1.json"))
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"c1.json": old, ".c1.json.7.tmp": nil} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	check := func(version string) {
		t.Helper()
		recs, err := a.records()
		if err != nil || len(recs) != 1 {
			t.Fatalf("%s: records = %+v, %v", version, recs, err)
		}
		c := recs[0]
		if c.ID != "c1" || c.Cgroup != "gpuiso-agent/c1" || !c.V2 || c.Process == nil || c.Process.Pid != 4242 || c.Process.Start != 987654321 {
			t.Errorf("%s: record %+v", version, c)
		}
	}
	check("version 1")
	if _, err := os.Stat(filepath.Join(dir, ".c1.json.7.tmp")); !os.IsNotExist(err) {
		t.Errorf("the temporary file is left: %v", err)
	}
	recs, _ := a.records()
	if err := a.write(recs[0]); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "c1.json")); !strings.HasPrefix(string(b), `{"format":"gpuiso-agent-container","version":2,"key":"c1"`) {
		t.Errorf("written as %s", b)
	}
	check("version 2")
}
