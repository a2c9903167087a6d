package hwtest_test

import (
	"archive/tar"
	"compress/gzip"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// bundleLimit is the most the bundle's tarball may weigh.
const bundleLimit = 64 << 20

// TestBundle builds the hardware suite bundle as `make hwtest` does, into a
// temporary directory, and checks what a GPU node will get: stripped test
// binaries (the hardware suites and the cgroup2 suites), the programs those
// run as scripts over their test binaries, a static probe, cudacheck, runc
// where this host built one, run.sh, and a tarball of them under the size
// limit.
func TestBundle(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nine test binaries")
	}
	script, err := filepath.Abs("bundle.sh")
	if err != nil || !isFile(script) {
		t.Skip("no source tree (a test binary from the bundle itself)")
	}
	for _, tool := range []string{"go", "gcc", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("building the bundle needs %s: %v", tool, err)
		}
	}
	out := filepath.Join(t.TempDir(), "hwbundle")
	cmd := exec.Command("bash", script, out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("bundle.sh: %v\n%s", err, b)
	}

	tests := []string{"hwtest.test", "nvmlnode.test", "cgroups.test", "native.test", "chain.test", "agent.test", "gpurun.test", "conformance.test", "gpuiso-runtime.test"}
	for prog, test := range map[string]string{"gpurun": "gpurun.test", "agent": "agent.test", "gpuiso-runtime": "gpuiso-runtime.test"} {
		b, err := os.ReadFile(filepath.Join(out, "bin", prog))
		if err != nil || !strings.HasPrefix(string(b), "#!/bin/sh\n") || !strings.Contains(string(b), `exec "$(dirname "$0")/`+test+`" "$@"`) {
			t.Errorf("bin/%s is not a script running %s: %q, %v", prog, test, b, err)
		}
	}
	if runc := filepath.Join("/var/cache/gpuiso/bin", "runc"); isFile(runc) && !isFile(filepath.Join(out, "bin", "runc")) {
		t.Errorf("the bundle lacks the runc this host built (%s)", runc)
	}
	for _, name := range append(slices.Clone(tests), "probe", "cudacheck") {
		f, err := elf.Open(filepath.Join(out, "bin", name))
		if err != nil {
			t.Errorf("bin/%s: %v", name, err)
			continue
		}
		if f.Section(".symtab") != nil {
			t.Errorf("bin/%s is not stripped", name)
		}
		if name == "probe" && slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP }) {
			t.Errorf("bin/probe is dynamically linked; test images FROM scratch need it static")
		}
		if name == "cudacheck" {
			libs, _ := f.ImportedLibraries()
			for _, l := range libs {
				if l != "libc.so.6" && l != "libdl.so.2" {
					t.Errorf("bin/cudacheck needs %s; it may link against libc and libdl alone", l)
				}
			}
		}
		f.Close()
	}
	if fi, err := os.Stat(filepath.Join(out, "run.sh")); err != nil || fi.Mode()&0o111 == 0 {
		t.Errorf("run.sh: %v, %v", fi, err)
	}

	tarball := filepath.Join(out, "gpuiso-hwtest.tar.gz")
	fi, err := os.Stat(tarball)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() >= bundleLimit {
		t.Errorf("%s weighs %d bytes, over the %d byte limit", tarball, fi.Size(), bundleLimit)
	}
	t.Logf("bundle: %.1f MiB", float64(fi.Size())/(1<<20))
	got := tarNames(t, tarball)
	for _, name := range append(tests, "probe", "cudacheck") {
		if !slices.Contains(got, "gpuiso-hwtest/bin/"+name) {
			t.Errorf("the tarball lacks gpuiso-hwtest/bin/%s: %v", name, got)
		}
	}
	if !slices.Contains(got, "gpuiso-hwtest/run.sh") {
		t.Errorf("the tarball lacks gpuiso-hwtest/run.sh: %v", got)
	}
}

func tarNames(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, filepath.Clean(h.Name))
	}
}
