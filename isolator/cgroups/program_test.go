package cgroups_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// TestProgram builds the v2 device program without privileges and compares
// its instruction listing with the one checked in; invalid rules are
// refused.
func TestProgram(t *testing.T) {
	tests := []struct {
		name  string
		rules []isolator.Rule
	}{
		{"one-gpu", []isolator.Rule{isolator.Allow(195, 1, "rwm")}},
		{"gpu-container", isolator.GPURules(nil, nil)},
		{"three-gpus-read-only-one", []isolator.Rule{isolator.Allow(195, 1, "rwm"), isolator.Allow(195, 3, "r"), isolator.Allow(195, 255, "rwm")}},
		{"none", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := cgroups.Program(tt.rules)
			if err != nil {
				t.Fatal(err)
			}
			got := fmt.Sprintf("license %s\n%v", p.License, p.Instructions)
			golden := filepath.Join("testdata", "program-"+tt.name+".golden")
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Fatalf("listing differs from %s (go test -update rewrites it):\n%s", golden, got)
			}
		})
	}
	if _, err := cgroups.Program([]isolator.Rule{{Allow: true, Type: 'q', Access: "r"}}); err == nil {
		t.Fatal("Program accepted an invalid rule")
	}
}
