package testenv

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
)

// ProbePackage is the import path of the probe program that test containers
// run (see testdata/probe).
const ProbePackage = "github.com/gpuiso/gpuiso/testdata/probe"

// ProbeEnv names the environment variable that points the suites at a
// prebuilt probe (a static binary of testdata/probe), so that test binaries
// built with go test -c run where there is no Go toolchain.
const ProbeEnv = "GPUISO_PROBE"

// BuildProbe returns the path of a static probe binary: the one ProbeEnv
// names, else a file named "probe" next to the test binary, else one it
// compiles into a temporary directory of tb with the go command.
func BuildProbe(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv(ProbeEnv); p != "" {
		if err := executable(p); err != nil {
			tb.Fatalf("%s=%s: %v", ProbeEnv, p, err)
		}
		return p
	}
	if exe, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(exe), "probe"); executable(p) == nil {
			return p
		}
	}
	if _, err := exec.LookPath("go"); err != nil {
		tb.Fatalf("no prebuilt probe (set %s, or put it next to the test binary) and no go command to build one: %v", ProbeEnv, err)
	}
	out := filepath.Join(tb.TempDir(), "probe")
	cmd := exec.Command("go", "build", "-buildvcs=false", "-trimpath", "-o", out, ProbePackage)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("build probe: %v\n%s", err, b)
	}
	return out
}

// executable reports why path is not a regular executable file.
func executable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s: not an executable file", path)
	}
	return nil
}

// ProbeImage describes a test image built FROM scratch around the probe.
type ProbeImage struct {
	Labels map[string]string // image labels (LABEL)
	Env    map[string]string // image environment (ENV)
}

// BuildProbeImage builds an image FROM scratch holding the probe at /probe
// (its entrypoint), with img's labels and environment, and returns its tag.
// No registry is needed. The image is removed when tb ends.
func BuildProbeImage(tb testing.TB, cli *client.Client, img ProbeImage) string {
	tb.Helper()
	probe, err := os.ReadFile(BuildProbe(tb))
	if err != nil {
		tb.Fatal(err)
	}
	var df strings.Builder
	df.WriteString("FROM scratch\nCOPY probe /probe\n")
	for _, k := range sortedKeys(img.Labels) {
		fmt.Fprintf(&df, "LABEL %q=%q\n", k, img.Labels[k])
	}
	for _, k := range sortedKeys(img.Env) {
		fmt.Fprintf(&df, "ENV %s=%q\n", k, img.Env[k])
	}
	df.WriteString("ENTRYPOINT [\"/probe\"]\n")

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range []struct {
		name string
		mode int64
		body []byte
	}{{"Dockerfile", 0o644, []byte(df.String())}, {"probe", 0o755, probe}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.body))}); err != nil {
			tb.Fatal(err)
		}
		if _, err := tw.Write(f.body); err != nil {
			tb.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}

	tag := fmt.Sprintf("gpuiso-probe:%s-%d", strings.ToLower(sanitize(tb.Name())), time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cli.ImageBuild(ctx, &buf, client.ImageBuildOptions{Tags: []string{tag}, Remove: true, ForceRemove: true})
	if err != nil {
		tb.Fatalf("build probe image: %v", err)
	}
	log, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		tb.Fatalf("build probe image: %v", err)
	}
	if bytes.Contains(log, []byte(`"error"`)) {
		tb.Fatalf("build probe image:\n%s", log)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cli.ImageRemove(ctx, tag, client.ImageRemoveOptions{Force: true, PruneChildren: true})
	})
	return tag
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-':
			return r
		}
		return '-'
	}, s)
}
