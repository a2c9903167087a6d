package ldcache_test

import (
	"os"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/ldcache"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestParseHost reads the host's own ld.so cache, where the NVIDIA
// libraries are installed. It is an external test: testenv reaches
// isolator/mps, which imports this package.
func TestParseHost(t *testing.T) {
	testenv.RequireNVIDIALibraries(t)
	b, err := os.ReadFile("/etc/ld.so.cache")
	if err != nil {
		t.Fatal(err)
	}
	c, err := ldcache.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range c.Entries {
		if e.Key == "libnvidia-ml.so.1" && strings.HasSuffix(e.Value, "/libnvidia-ml.so.1") && e.IsELF() {
			t.Logf("%s (flags %#x, %d-bit) => %s", e.Key, e.Flags, e.Bits(), e.Value)
			return
		}
	}
	t.Fatalf("libnvidia-ml.so.1 not among the %d entries of /etc/ld.so.cache", len(c.Entries))
}
