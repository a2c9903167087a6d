package cdi

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// TestTempNameMarksWriter: the temporary file a write makes names the
// writing process, so that a sweep keeps it while that process runs and
// removes it once the name no longer names a live process.
func TestTempNameMarksWriter(t *testing.T) {
	self, err := linux.Self("/proc")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "nvidia.com-gpu.json")
	f, err := os.CreateTemp(dir, tempPattern(path, "/proc"))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	name := filepath.Base(f.Name())
	mark := "." + self.String() + "."
	if !strings.Contains(name, mark) {
		t.Fatalf("temporary file %q does not name its writer %s", name, self)
	}
	if deadTemp(name, "/proc") {
		t.Fatalf("a live writer's temporary file %q counts as dead", name)
	}
	other := strings.Replace(name, mark, "."+strconv.Itoa(self.Pid)+"."+strconv.FormatUint(self.Start+1, 10)+".", 1)
	if !deadTemp(other, "/proc") {
		t.Fatalf("%q, of another process under the writer's pid, counts as live", other)
	}
}
