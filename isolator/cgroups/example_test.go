package cgroups_test

import (
	"fmt"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
)

// The cgroup v2 device program of a container allowed GPU 1, built without
// privileges: a check of each access against the allowed node, then a
// refusal of everything else.
func ExampleProgram() {
	p, err := cgroups.Program([]isolator.Rule{isolator.Allow(195, 1, "rwm")})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(p.Type, p.License, len(p.Instructions))
	// Output:
	// CGroupDevice Apache 12
}
