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

// BuildProbe compiles the probe statically into a temporary directory of tb
// and returns the binary's path. The go command must be on PATH (it is where
// tests run).
func BuildProbe(tb testing.TB) string {
	tb.Helper()
	out := filepath.Join(tb.TempDir(), "probe")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, ProbePackage)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("build probe: %v\n%s", err, b)
	}
	return out
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
