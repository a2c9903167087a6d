package containerizer_test

import (
	"testing"

	"github.com/gpuiso/gpuiso/containerizer"
)

// TestCgroupParent: the names are those the native runtime and the chain
// isolator gave their parents before they shared one function (containers
// running across an upgrade keep their cgroups), and depend on the
// directory, cleaned, alone.
func TestCgroupParent(t *testing.T) {
	for _, tc := range []struct{ letter, salt, dir, want string }{
		{"a", "chain", "/var/lib/agent/gpu", "gpuiso/ab19ebb72d45a"},
		{"a", "chain", "/var/lib/agent/./gpu/", "gpuiso/ab19ebb72d45a"},
		{"i", "", "/var/lib/gpuiso/native", "gpuiso/i69831ad60e4c"},
	} {
		if got := containerizer.CgroupParent(tc.letter, tc.salt, tc.dir); got != tc.want {
			t.Errorf("CgroupParent(%q, %q, %q) = %q, want %q", tc.letter, tc.salt, tc.dir, got, tc.want)
		}
	}
	if containerizer.CgroupParent("i", "", "/a") == containerizer.CgroupParent("i", "", "/b") {
		t.Error("two directories share a parent")
	}
}
