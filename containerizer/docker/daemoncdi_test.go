package docker_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cdi"
)

// TestDaemonCDI launches a container through the containerizer with CDI on,
// against a current Docker daemon started beside the host's with gpuiso's
// CDI spec of a simulated DGX-1 in its spec directory: the daemon gets a
// CDI device request (not device mappings), and the container sees exactly
// its two GPUs, a node it makes itself for another GPU denied. It runs
// where such a daemon was built (.ci/current-docker.sh, which the full
// test command's provisioning runs, builds one from the Go module proxy).
func TestDaemonCDI(t *testing.T) {
	dir := testenv.RequireCurrentDocker(t)
	_, host, inv := testenv.SimulatedNode(t, "dgx1-volta")
	spec, err := cdi.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	specDir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := (cdi.Writer{Dir: specDir}).Write(ctx, spec); err != nil {
		t.Fatal(err)
	}
	d := testenv.StartDockerdWith(t, testenv.DockerdOptions{
		Binary: filepath.Join(dir, "dockerd"),
		Path:   []string{dir},
		Config: map[string]any{"cdi-spec-dirs": []string{specDir}, "features": map[string]bool{"cdi": true}},
	})
	ver, err := d.Client.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("daemon %s, API %s", ver.Version, ver.APIVersion)
	img := testenv.BuildProbeImage(t, d.Client, testenv.ProbeImage{})
	alloc, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	z, err := docker.New(d.Client, alloc, docker.WithCDI(cdi.DefaultKind))
	if err != nil {
		t.Fatal(err)
	}
	major := host.NVIDIAMajor
	var out, errOut bytes.Buffer
	c, err := z.Launch(ctx, containerizer.Spec{ID: "cdi-2", Image: img, GPUs: allocator.Request{Devices: []string{"2", "3"}},
		Command: []string{"do", "ls", "/dev", "--", "mknod", "/dev/g5", fmt.Sprint(major), "5", "open", "--", "open", "/dev/nvidia2", "/dev/nvidia3"},
		Stdout:  &out, Stderr: &errOut})
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	t.Cleanup(func() { z.Destroy(context.Background(), c.ID) })
	st, err := z.Wait(ctx, c.ID)
	if err != nil || st.Code != 0 {
		t.Fatalf("wait: %+v %v\nstdout: %s\nstderr: %s", st, err, &out, &errOut)
	}
	ins, err := d.Client.ContainerInspect(ctx, c.RuntimeID, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reqs := ins.Container.HostConfig.DeviceRequests
	if len(reqs) != 1 || reqs[0].Driver != "cdi" || len(ins.Container.HostConfig.Devices) != 0 {
		t.Errorf("the daemon got device requests %+v and mappings %+v, want one CDI request", reqs, ins.Container.HostConfig.Devices)
	}
	var nodes []string
	got := map[string]bool{}
	for l := range strings.Lines(out.String()) {
		l = strings.TrimSpace(l)
		got[l] = true
		if rest, ok := strings.CutPrefix(l, "nvidia"); ok && rest != "" && strings.Trim(rest, "0123456789") == "" {
			nodes = append(nodes, l)
		}
	}
	slices.Sort(nodes)
	if !slices.Equal(nodes, []string{"nvidia2", "nvidia3"}) || !got["/dev/nvidia2 ENXIO"] || !got["/dev/nvidia3 ENXIO"] || !got["/dev/g5 EPERM"] {
		t.Errorf("want exactly GPUs 2 and 3 (open: ENXIO) and GPU 5 denied (EPERM):\n%s", &out)
	}
}
