package containerizer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/simnode"
	"github.com/gpuiso/gpuiso/record"
	"github.com/gpuiso/gpuiso/volume"
)

// imagelessDaemon is a Docker daemon that has no image and no container.
// Any other call panics (the embedded nil Client).
type imagelessDaemon struct{ docker.Client }

func (imagelessDaemon) ImageInspect(_ context.Context, ref string, _ ...client.ImageInspectOption) (client.ImageInspectResult, error) {
	return client.ImageInspectResult{}, fmt.Errorf("Error response from daemon: No such image: %s: %w", ref, cerrdefs.ErrNotFound)
}

func (imagelessDaemon) ContainerList(context.Context, client.ContainerListOptions) (client.ContainerListResult, error) {
	return client.ContainerListResult{}, nil
}

// TestFailureRoutes: each public failure a caller routes on (wait and
// retry, give up on this node, fix the request, repair state) matches
// exactly one of node's error kinds, the one that sends the caller the
// right way. "Impossible on this node" (ErrInvalid, ErrNotSupported) is
// kept apart from "not now" (ErrInsufficient, ErrExists): a caller that
// waits for capacity must never wait for what no capacity brings.
func TestFailureRoutes(t *testing.T) {
	ctx := context.Background()
	inv, plain := simAllocator(t, "rtx8000x4")
	mem := inv.Devices[0].MemoryBytes
	shared, err := allocator.New(inv, allocator.WithShared("1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shared.Allocate(ctx, "big", allocator.Request{Share: &allocator.Share{MemoryBytes: mem - 1<<30}}); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Allocate(ctx, "held", allocator.Request{Count: 3}); err != nil {
		t.Fatal(err)
	}
	drt, err := docker.NewRuntime(imagelessDaemon{})
	if err != nil {
		t.Fatal(err)
	}
	_, lalloc := simAllocator(t, "pcie8")
	life, err := containerizer.NewLifecycle(containerizer.LifecycleConfig{Runtimes: []containerizer.Runtime{drt}, Allocator: lalloc})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	store, err := record.New(dir, record.Options[string]{Format: "routes", Version: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bad.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing, _ := record.New(filepath.Join(dir, "missing"), record.Options[string]{Format: "routes", Version: 1})
	spec, err := cdi.New(inv)
	if err != nil {
		t.Fatal(err)
	}

	for _, tt := range []struct {
		name string
		call func() error
		kind error
	}{
		// Shares: never ErrInsufficient for what no release can bring.
		{"a share on a node with no shareable GPU", func() error {
			_, err := plain.Allocate(ctx, "s", allocator.Request{Share: &allocator.Share{MemoryBytes: 1 << 30}})
			return err
		}, node.ErrNotSupported},
		{"a share larger than every GPU", func() error {
			_, err := shared.Allocate(ctx, "s", allocator.Request{Share: &allocator.Share{MemoryBytes: 2 * mem}})
			return err
		}, node.ErrInvalid},
		{"a share that does not fit now", func() error {
			_, err := shared.Allocate(ctx, "s", allocator.Request{Share: &allocator.Share{MemoryBytes: 2 << 30}})
			return err
		}, node.ErrInsufficient},
		{"more GPUs than are free", func() error {
			_, err := plain.Allocate(ctx, "x", allocator.Request{Count: 2})
			return err
		}, node.ErrInsufficient},
		{"more GPUs than the node has", func() error {
			_, err := plain.Allocate(ctx, "x", allocator.Request{Count: 5})
			return err
		}, node.ErrInvalid},
		{"an owner that holds GPUs already", func() error {
			_, err := plain.Allocate(ctx, "held", allocator.Request{Count: 1})
			return err
		}, node.ErrExists},
		{"a release of an owner holding nothing", func() error { return plain.Release(ctx, "nobody") }, node.ErrNotFound},
		{"a GPU the node lacks", func() error {
			_, err := plain.Allocate(ctx, "x", allocator.Request{Devices: []string{"GPU-none"}})
			return err
		}, node.ErrNotFound},
		{"a group over its quota", func() error {
			a, err := allocator.New(inv, allocator.WithQuota("team", 1))
			if err != nil {
				return err
			}
			if _, err := a.Allocate(ctx, "t1", allocator.Request{Count: 1, Group: "team"}); err != nil {
				return err
			}
			_, err = a.Allocate(ctx, "t2", allocator.Request{Count: 1, Group: "team"})
			return err
		}, node.ErrInsufficient},
		{"a corrupt allocator state file", func() error {
			state := t.TempDir()
			if err := os.WriteFile(filepath.Join(state, allocator.StateFile), []byte("{"), 0o600); err != nil {
				return err
			}
			_, err := allocator.New(inv, allocator.WithStateDir(state))
			return err
		}, node.ErrCorrupt},
		{"a zero allocator", func() error {
			_, err := (&allocator.Allocator{}).Allocate(ctx, "x", allocator.Request{Count: 1})
			return err
		}, node.ErrInvalid},

		// Docker.
		{"a missing Docker image", func() error {
			_, err := life.Launch(ctx, containerizer.Spec{ID: "c1", Image: "no-such-image"})
			return err
		}, node.ErrNotFound},
		{"Update of an unknown container", func() error {
			_, err := life.Update(ctx, "c1", 2)
			return err
		}, node.ErrNotFound},

		// The record store.
		{"a zero record store", func() error {
			return (&record.Store[string]{}).Write(record.Entry[string]{Key: "k", Phase: record.Started})
		}, node.ErrInvalid},
		{"a record written into a missing directory", func() error { return missing.Write(record.Entry[string]{Key: "k", Phase: record.Started}) }, node.ErrNotFound},
		{"a record that is not there", func() error { _, err := store.Read("none"); return err }, node.ErrNotFound},
		{"a corrupt record", func() error { _, err := store.Read("bad"); return err }, node.ErrCorrupt},
		{"a bad record key", func() error { _, err := store.Read("../x"); return err }, node.ErrInvalid},

		// CDI.
		{"a relative CDI spec directory", func() error { _, err := (cdi.Writer{Dir: "cdi"}).Write(ctx, spec); return err }, node.ErrInvalid},
		{"a bad CDI kind", func() error { _, err := cdi.Writer{Dir: dir}.Path("no-class"); return err }, node.ErrInvalid},
		{"a CDI spec file that is not there", func() error { _, err := cdi.ValidateFile(filepath.Join(dir, "none.json")); return err }, node.ErrNotFound},
		{"a CDI spec file that does not validate", func() error { _, err := cdi.ValidateFile(filepath.Join(dir, "bad.json")); return err }, node.ErrInvalid},
		{"a CDI spec of a node without GPUs", func() error { _, err := cdi.New(&node.Inventory{}); return err }, node.ErrNotFound},

		// The model and the volume.
		{"a bad owner id", func() error { return node.ValidateOwner("-x") }, node.ErrInvalid},
		{"a bad process", func() error { _, err := node.ParseProcess("1"); return err }, node.ErrInvalid},
		{"an unknown simulated topology", func() error { _, err := simnode.New("no-such-node"); return err }, node.ErrNotFound},
		{"a bad PCI bus id", func() error { _, err := node.NormalizeBusID("not-a-bus-id"); return err }, node.ErrInvalid},
		{"a requirement the driver does not meet", func() error {
			return volume.Check(volume.Image{Env: []string{"NVIDIA_REQUIRE_CUDA=cuda>=99.0"}}, volume.Driver{Version: "535.104.05", CUDA: node.CUDAVersion(12020)}, nil)
		}, node.ErrNotSupported},
		{"an unknown network", func() error { _, err := containerizer.ParseNetwork("bridge"); return err }, node.ErrInvalid},
		{"a Docker runtime without a client", func() error { _, err := docker.NewRuntime(nil); return err }, node.ErrInvalid},
		{"a requirement that does not parse", func() error { _, err := volume.ParseRequirement("NVIDIA_REQUIRE_CUDA", "cuda>>1"); return err }, node.ErrInvalid},
	} {
		t.Run(tt.name, func(t *testing.T) {
			checkKind(t, tt.call(), tt.kind)
		})
	}

	// A simulated host over a tree already there (root only: a host tree
	// is made as root).
	t.Run("MakeHost over a tree", func(t *testing.T) {
		testenv.RequireRoot(t)
		sim, host, _ := testenv.SimulatedNode(t, "pcie8")
		again, err := sim.MakeHost(host.Root)
		if err == nil {
			again.Remove()
		}
		checkKind(t, err, node.ErrExists)
	})
}

// checkKind fails t unless err matches kind and no other of node's kinds.
func checkKind(t *testing.T, err, kind error) {
	t.Helper()
	kinds := []error{node.ErrNotSupported, node.ErrInvalid, node.ErrExists, node.ErrNotFound, node.ErrInsufficient, node.ErrUnavailable, node.ErrCorrupt}
	var matched []string
	for _, k := range kinds {
		if errors.Is(err, k) {
			matched = append(matched, k.Error())
		}
	}
	if len(matched) != 1 || !errors.Is(err, kind) {
		t.Fatalf("%v: matches the kinds %q, want exactly %q", err, matched, kind.Error())
	}
}
