package cgroups_test

import (
	"testing"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
)

// TestProgram builds the v2 device program without privileges: one block of
// instructions per rule after the prologue, and invalid rules refused.
func TestProgram(t *testing.T) {
	small, err := cgroups.Program([]isolator.Rule{isolator.Allow(195, 1, "rwm")})
	if err != nil {
		t.Fatal(err)
	}
	big, err := cgroups.Program([]isolator.Rule{isolator.Allow(195, 1, "rwm"), isolator.Allow(195, 3, "rwm"), isolator.Allow(195, 255, "rwm")})
	if err != nil {
		t.Fatal(err)
	}
	if len(big.Instructions) <= len(small.Instructions) || small.License == "" {
		t.Fatalf("programs of 1 and 3 rules have %d and %d instructions", len(small.Instructions), len(big.Instructions))
	}
	if _, err := cgroups.Program([]isolator.Rule{{Allow: true, Type: 'q', Access: "r"}}); err == nil {
		t.Fatal("Program accepted an invalid rule")
	}
}
