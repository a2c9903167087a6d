package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestCommandExitCodes: as under docker run, a command the container cannot
// find exits 127 and one it cannot execute 126 (dockerrun's own errors are
// 125).
func TestCommandExitCodes(t *testing.T) {
	testenv.RequireRoot(t)
	cli := testenv.RequireDocker(t)
	testenv.LockDocker(t, false)
	// The probe image without its entrypoint, so that the command is the
	// container's first process.
	img := withoutEntrypoint(t, cli, testenv.BuildProbeImage(t, cli, testenv.ProbeImage{}))
	for _, tc := range []struct {
		name string
		cmd  []string
		want int
	}{
		{"not found", []string{"/nonexistent"}, 127},
		{"not in PATH", []string{"nonexistent"}, 127},
		{"not executable", []string{"/"}, 126},
		{"its own status", []string{"/probe", "exit", "3"}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errOut, code := dockerrun(append([]string{"--simulate", "pcie8", "--gpus", "0", "--quiet", img}, tc.cmd...)...)
			if code != tc.want {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.want, errOut)
			}
		})
	}
}

// withoutEntrypoint builds FROM base an image with no entrypoint and
// returns its tag, removed when t ends.
func withoutEntrypoint(t *testing.T, cli *client.Client, base string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	df := []byte(fmt.Sprintf("FROM %s\nENTRYPOINT []\n", base))
	if err := tw.WriteHeader(&tar.Header{Name: "Dockerfile", Mode: 0o644, Size: int64(len(df))}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(df); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	tag := base + "-noentry"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cli.ImageBuild(ctx, &buf, client.ImageBuildOptions{Tags: []string{tag}, Remove: true, ForceRemove: true})
	if err != nil {
		t.Fatalf("build %s: %v", tag, err)
	}
	log, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || bytes.Contains(log, []byte(`"error"`)) {
		t.Fatalf("build %s: %v\n%s", tag, err, log)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cli.ImageRemove(ctx, tag, client.ImageRemoveOptions{Force: true})
	})
	return tag
}
