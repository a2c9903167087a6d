package docker_test

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/simnode"
	"github.com/gpuiso/gpuiso/volume"
)

// rig is a Docker containerizer over a simulated node, with its pieces.
type rig struct {
	cli      *client.Client
	node     *simnode.Node
	host     *simnode.Host
	inv      *node.Inventory
	alloc    *allocator.Allocator
	volumes  *volume.Manager
	stateDir string
	ns       string
	z        *docker.Containerizer
}

// newRig gates the test on root and a Docker daemon, holds the daemon lock
// (exclusive for a test that stops the daemon), and builds a containerizer with its own namespace, a durable
// allocator and a driver volume manager.
func newRig(t *testing.T, nodeName string, exclusive bool) *rig {
	t.Helper()
	testenv.RequireRoot(t)
	cli := testenv.RequireDocker(t)
	testenv.RequireNVIDIALibraries(t)
	testenv.LockDocker(t, exclusive)
	node, host, inv := testenv.SimulatedNode(t, nodeName)
	r := &rig{cli: cli, node: node, host: host, inv: inv, stateDir: t.TempDir(), ns: namespace(t)}
	var err error
	r.volumes, err = volume.New(volume.WithRoot(filepath.Join(t.TempDir(), "volumes")))
	if err != nil {
		t.Fatal(err)
	}
	r.restart(t)
	t.Cleanup(func() { r.removeAll(t) })
	return r
}

// restart builds a new allocator over the same state directory and a new
// containerizer over it: what a restarted agent gets.
func (r *rig) restart(t *testing.T, opts ...docker.Option) {
	t.Helper()
	var err error
	r.alloc, err = allocator.New(r.inv, allocator.WithStateDir(r.stateDir))
	if err != nil {
		t.Fatal(err)
	}
	opts = append([]docker.Option{docker.WithVolumes(r.volumes), docker.WithNamespace(r.ns), docker.WithStopTimeout(time.Second)}, opts...)
	r.z, err = docker.New(r.cli, r.alloc, opts...)
	if err != nil {
		t.Fatal(err)
	}
}

// namespace is a namespace of the test's own, so that tests never adopt
// each other's containers.
func namespace(t *testing.T) string {
	return "test-" + strings.NewReplacer("/", "-", " ", "-", "=", "-").Replace(t.Name()) + "-" + time.Now().Format("150405.000000")
}

// ours lists the daemon's containers of the rig's namespace.
func (r *rig) ours(t *testing.T) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := r.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", docker.LabelNamespace+"="+r.ns)})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range list.Items {
		ids = append(ids, s.ID)
	}
	return ids
}

// removeAll removes whatever containers of the namespace a failed test left.
func (r *rig) removeAll(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := r.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", docker.LabelNamespace+"="+r.ns)})
	if err != nil {
		return
	}
	for _, s := range list.Items {
		r.cli.ContainerRemove(ctx, s.ID, client.ContainerRemoveOptions{Force: true})
	}
}

// image builds a probe image with the given labels and environment.
func (r *rig) image(t *testing.T, labels, env map[string]string) string {
	t.Helper()
	return testenv.BuildProbeImage(t, r.cli, testenv.ProbeImage{Labels: labels, Env: env})
}

// run launches spec, waits for it and destroys it, and returns its output
// and exit status.
func (r *rig) run(t *testing.T, spec containerizer.Spec) (c containerizer.Container, stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	spec.Stdout, spec.Stderr = &out, &errOut
	c, err := r.z.Launch(ctx, spec)
	if err != nil {
		t.Fatalf("launch %s: %v", spec.ID, err)
	}
	st, err := r.z.Wait(ctx, spec.ID)
	if err != nil {
		t.Fatalf("wait %s: %v", spec.ID, err)
	}
	if err := r.z.Destroy(ctx, spec.ID); err != nil {
		t.Fatalf("destroy %s: %v", spec.ID, err)
	}
	return c, out.String(), errOut.String(), st.Code
}

// lines parses "<key> <value>" lines of the probe into a map.
func lines(s string) map[string]string {
	m := map[string]string{}
	for l := range strings.Lines(s) {
		k, v, _ := strings.Cut(strings.TrimSpace(l), " ")
		m[k] = v
	}
	return m
}
