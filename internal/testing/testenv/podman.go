package testenv

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// PodmanRunFlags are the flags every "podman run" of the tests passes: runc
// on the test hosts refuses Podman's default resource limits.
var PodmanRunFlags = []string{"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"}

// RequirePodman skips tb unless the process is root and a Podman binary
// answers "podman version" (rootful Podman: it makes device nodes). It
// returns the binary's path.
func RequirePodman(tb testing.TB) string {
	tb.Helper()
	if !linux.IsRoot() {
		skip(tb, Podman, "needs root for rootful Podman (device nodes)")
	}
	path, err := exec.LookPath("podman")
	if err != nil {
		skip(tb, Podman, "no podman on PATH: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, path, "version", "--format", "{{.Client.Version}}").CombinedOutput(); err != nil {
		skip(tb, Podman, "podman version: %v: %s", err, bytes.TrimSpace(out))
	}
	return path
}

// RunPodman runs podman with args and returns its combined output; a failure
// is returned with that output, for tests that expect one.
func RunPodman(ctx context.Context, podman string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, podman, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("podman %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// BuildPodmanProbeImage imports an image whose root file system holds only
// the probe at /probe (its entrypoint), from a tar (no registry), and
// returns its name. The image is removed when tb ends.
func BuildPodmanProbeImage(tb testing.TB, podman string) string {
	tb.Helper()
	probe, err := os.ReadFile(BuildProbe(tb))
	if err != nil {
		tb.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "probe", Mode: 0o755, Size: int64(len(probe))}); err != nil {
		tb.Fatal(err)
	}
	if _, err := tw.Write(probe); err != nil {
		tb.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	rootfs := filepath.Join(tb.TempDir(), "rootfs.tar")
	if err := os.WriteFile(rootfs, buf.Bytes(), 0o644); err != nil {
		tb.Fatal(err)
	}
	name := fmt.Sprintf("localhost/gpuiso-probe:%s-%d", strings.ToLower(sanitize(tb.Name())), time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := RunPodman(ctx, podman, "import", "--change", `ENTRYPOINT ["/probe"]`, rootfs, name); err != nil {
		tb.Fatalf("import probe image: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		RunPodman(ctx, podman, "rmi", "--force", name)
	})
	return name
}
