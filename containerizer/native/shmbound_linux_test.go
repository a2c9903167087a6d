package native_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/isolator/mps"
)

// TestShareShmBounded: a memory share's container that writes 3 GiB into
// its /dev/shm gets ENOSPC at the MPS manager's documented size
// (mps.DefaultShmBytes, as a plain container's /dev/shm), and the disk of
// the state directories does not grow by it while the share holds what
// it wrote.
func TestShareShmBounded(t *testing.T) {
	testenv.RequireSimulatedMPS(t)
	n := newNode(t, cgroups.V2)
	ctx := context.Background()
	m, err := mps.New(filepath.Join(t.TempDir(), "mps"), mps.WithRegistry(filepath.Join(t.TempDir(), "registry")))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		m.Sweep(ctx, nil)
		m.Close()
	}()
	alloc, err := allocator.New(n.inv, allocator.WithShared("0"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := native.New(native.Config{Allocator: alloc, Inventory: n.inv, Isolator: n.iso, MPS: m, StateDir: filepath.Join(t.TempDir(), "state")})
	if err != nil {
		t.Fatal(err)
	}
	// What the state directory holds on its own disk: the blocks of every
	// file under it on the device it is on (a tmpfs mounted inside, as the
	// share's /dev/shm should be, is another device). The disk's free space
	// would also count what other tests running at once write.
	var dev uint64
	used := func() int64 {
		var total int64
		err := filepath.WalkDir(m.Dir(), func(p string, _ os.DirEntry, err error) error {
			if err != nil {
				return nil // removed meanwhile
			}
			var st unix.Stat_t
			if unix.Lstat(p, &st) != nil {
				return nil
			}
			if p == m.Dir() {
				dev = st.Dev
			}
			if st.Dev == dev {
				total += st.Blocks * 512
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return total
	}
	before := used()
	var out bytes.Buffer
	script := `dd if=/dev/zero of=/dev/shm/fill bs=1M count=3072 2>&1 | grep -o 'No space left on device' | head -1
		echo "size: $(wc -c < /dev/shm/fill)"`
	if _, err := c.Launch(ctx, containerizer.Spec{ID: "filler", Command: []string{"/bin/sh", "-c", script},
		GPUs: allocator.Request{Share: &allocator.Share{MemoryBytes: 1 << 30}}, Stdout: &out, Stderr: &out}); err != nil {
		t.Fatal(err)
	}
	defer c.Destroy(ctx, "filler")
	if st, err := c.Wait(ctx, "filler"); err != nil || st.Code != 0 {
		t.Fatalf("exit %+v, %v\n%s", st, err, out.String())
	}
	// The share still holds what its container wrote.
	lost := used() - before
	got := lines(out.String())
	if !got["No space left on device"] {
		t.Errorf("no ENOSPC writing 3 GiB into /dev/shm:\n%s", out.String())
	}
	for l := range got {
		if s, ok := strings.CutPrefix(l, "size: "); ok {
			if n, err := strconv.ParseInt(s, 10, 64); err != nil || n > mps.DefaultShmBytes {
				t.Errorf("/dev/shm took %s bytes, more than its %d", s, mps.DefaultShmBytes)
			}
		}
	}
	if lost > 32<<20 {
		t.Errorf("the state directory's disk lost %d bytes to the share's /dev/shm", lost)
	}
	if err := c.Destroy(ctx, "filler"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(m.Dir(), "filler")); !os.IsNotExist(err) {
		t.Errorf("the share's directory after Destroy: %v", err)
	}
}

// TestShmBounded: a plain container's own /dev/shm stops with ENOSPC at
// 64 MiB, as Docker's does.
func TestShmBounded(t *testing.T) {
	n := newNode(t, cgroups.V2)
	out, _ := n.run(t, "plain", allocator.Request{}, `dd if=/dev/zero of=/dev/shm/fill bs=1M count=3072 2>&1 | grep -o 'No space left on device' | head -1
		echo "size: $(wc -c < /dev/shm/fill)"`)
	if !lines(out)["No space left on device"] || !lines(out)["size: "+strconv.Itoa(64<<20)] {
		t.Errorf("writing 3 GiB into /dev/shm:\n%s", out)
	}
}
