package conformance

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dockercontainer "github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/dockerconfig"
)

// dockerSubject: examples/dockerrun on the host's Docker daemon.
func dockerSubject() subject {
	return subject{name: "docker", batch: 3, every: 25 * time.Millisecond,
		setup: func(t *testing.T, bins binaries) func(*testing.T, string) instance {
			dc := testenv.RequireDocker(t)
			testenv.LockDocker(t, false)
			img := testenv.BuildProbeImage(t, dc, testenv.ProbeImage{})
			return func(t *testing.T, dir string) instance {
				return &dockerInstance{base: newBase(t, dir), bins: bins, dc: dc, img: img}
			}
		}}
}

type dockerInstance struct {
	base
	bins binaries
	dc   *client.Client
	img  string
	mu   sync.Mutex
	cmds []*exec.Cmd
}

func (d *dockerInstance) dockerrun(ctx context.Context, args ...string) *exec.Cmd {
	var all []string
	if len(args) > 0 && args[0] == "gc" {
		all, args = []string{"gc"}, args[1:]
	}
	all = append(all, "--simulate", simulated, "--state-dir", d.state)
	cmd := d.command(ctx, d.bins.dockerrun, append(all, args...)...)
	d.mu.Lock()
	d.cmds = append(d.cmds, cmd)
	d.mu.Unlock()
	return cmd
}

func (d *dockerInstance) run(ctx context.Context, gpus int, args ...string) *exec.Cmd {
	return d.dockerrun(ctx, append([]string{"--gpus", strconv.Itoa(gpus), d.img}, args...)...)
}

func (d *dockerInstance) recovery(ctx context.Context) *exec.Cmd { return d.dockerrun(ctx, "gc") }

func (d *dockerInstance) idOf(pid int, line string) (string, bool) {
	return "dockerrun-" + strconv.Itoa(pid), strings.HasPrefix(line, "dockerrun: GPUs")
}

// namespace is the containerizer namespace of the state directory, as the
// containers' labels carry it.
func (d *dockerInstance) namespace() string {
	sum := sha256.Sum256([]byte(d.state))
	return "dockerrun-" + hex.EncodeToString(sum[:6])
}

// containers lists the instance's containers (all, or the running ones):
// those labelled with its namespace.
func (d *dockerInstance) containers(ctx context.Context, all bool) ([]string, map[string]string, error) {
	list, err := d.dc.ContainerList(ctx, client.ContainerListOptions{
		All: all, Filters: make(client.Filters).Add("label", docker.LabelNamespace+"="+d.namespace()),
	})
	if err != nil {
		return nil, nil, err
	}
	var ids []string
	owner := map[string]string{}
	for _, c := range list.Items {
		ids = append(ids, c.ID)
		owner[c.ID] = c.Labels[dockerconfig.LabelOwner]
	}
	return ids, owner, nil
}

func (d *dockerInstance) records() []string {
	_, owner, _ := d.containers(context.Background(), true)
	var ids []string
	for _, o := range owner {
		ids = append(ids, o)
	}
	return ids
}

func (d *dockerInstance) live() ([]Container, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids, owner, err := d.containers(ctx, false)
	if err != nil {
		return nil, err
	}
	var out []Container
	for _, id := range ids {
		res, err := d.dc.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
		if err != nil || res.Container.State == nil || !res.Container.State.Running || res.Container.State.Pid <= 0 {
			continue // gone since the listing
		}
		out = append(out, Container{ID: owner[id], Proc: ProcOf(res.Container.State.Pid)})
	}
	return out, nil
}

// hold: the probe in an image FROM scratch waits for a file in its own
// root; letGo has the probe write it there (an exec in the container).
func (d *dockerInstance) hold(key string) []string { return []string{"wait", "/release-" + key} }

func (d *dockerInstance) letGo(ctx context.Context, key string) error {
	ids, _, err := d.containers(ctx, false)
	if err != nil {
		return err
	}
	for _, id := range ids {
		res, err := d.dc.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
		if err != nil || !slices.Contains(res.Container.Args, "/release-"+key) {
			continue
		}
		ex, err := d.dc.ExecCreate(ctx, id, client.ExecCreateOptions{Cmd: []string{"/probe", "write", "/release-" + key}})
		if err == nil {
			_, err = d.dc.ExecStart(ctx, ex.ID, client.ExecStartOptions{Detach: true})
		}
		if err != nil {
			return fmt.Errorf("exec in container %.12s: %w", id, err)
		}
		return nil
	}
	return fmt.Errorf("no running container waits for %s", key)
}

func (d *dockerInstance) allocDir() string { return d.state }

func (d *dockerInstance) parents() []string {
	return []string{filepath.Join(cgroupRoot, "devices", "docker")}
}

func (d *dockerInstance) leftovers(ids []string, _ []string) []string {
	left := d.common(ids, d.allocDir())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cids, owner, err := d.containers(ctx, true)
	if err != nil {
		left = append(left, err.Error())
	}
	for _, id := range cids {
		left = append(left, fmt.Sprintf("Docker container %.12s of %s", id, owner[id]))
	}
	// A container of one of the runs that carries another namespace.
	list, err := d.dc.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", dockerconfig.LabelOwner)})
	if err == nil {
		for _, c := range list.Items {
			if o := c.Labels[dockerconfig.LabelOwner]; slices.Contains(ids, o) && !slices.Contains(cids, c.ID) {
				left = append(left, fmt.Sprintf("Docker container %.12s of %s in namespace %q", c.ID, o, c.Labels[docker.LabelNamespace]))
			}
		}
	}
	return left
}

func (d *dockerInstance) teardown() {
	d.mu.Lock()
	cmds := slices.Clone(d.cmds)
	d.mu.Unlock()
	killAll(cmds)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ids, _, _ := d.containers(ctx, true)
	for _, id := range ids {
		d.dc.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true})
	}
	d.recovery(ctx).Run()
}

// neighbours: a running container of the daemon that is not gpuiso's.
func (d *dockerInstance) neighbours(t *testing.T) []neighbour {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := d.dc.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config:     &dockercontainer.Config{Image: d.img, Cmd: []string{"sleep", "600"}},
		HostConfig: &dockercontainer.HostConfig{NetworkMode: "none"},
	})
	if err != nil {
		t.Fatalf("create a container: %v", err)
	}
	id := res.ID
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		d.dc.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true})
	})
	if _, err := d.dc.ContainerStart(ctx, id, client.ContainerStartOptions{}); err != nil {
		t.Fatalf("start container %.12s: %v", id, err)
	}
	return []neighbour{{name: fmt.Sprintf("Docker container %.12s (not gpuiso's)", id), alive: func() bool {
		res, err := d.dc.ContainerInspect(context.Background(), id, client.ContainerInspectOptions{})
		return err == nil && res.Container.State != nil && res.Container.State.Running
	}}}
}
