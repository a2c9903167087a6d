package docker_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/isolator/dockerconfig"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// listDaemon lists its containers (every one, whatever the filter) and
// removes them. Any other call panics.
type listDaemon struct {
	docker.Client
	mu         sync.Mutex
	containers []container.Summary
	removed    []string
}

func (f *listDaemon) ContainerList(context.Context, client.ContainerListOptions) (client.ContainerListResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return client.ContainerListResult{Items: slices.Clone(f.containers)}, nil
}

func (f *listDaemon) ContainerRemove(_ context.Context, id string, _ client.ContainerRemoveOptions) (client.ContainerRemoveResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, id)
	f.containers = slices.DeleteFunc(f.containers, func(s container.Summary) bool { return s.ID == id })
	return client.ContainerRemoveResult{}, nil
}

// supervisorLabel is h as LabelSupervisor holds it.
func supervisorLabel(h allocator.Holder) string {
	return strconv.Itoa(h.Pid) + "." + strconv.FormatUint(h.Start, 10)
}

// TestClean: Clean removes the containers of dead supervisors and gives
// back their GPUs, releases the owners whose holder died, claims the GPUs
// of live supervisors' containers, and leaves agents' containers and its
// own alone. No daemon needed.
func TestClean(t *testing.T) {
	ctx := context.Background()
	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := nvmlnode.Discover(ctx, nvmlnode.WithNVML(sim.NVML()))
	if err != nil {
		t.Fatal(err)
	}
	self, err := allocator.ProcessHolder("", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	live, err := allocator.ProcessHolder("", os.Getppid()) // another live process
	if err != nil {
		t.Fatal(err)
	}
	dead := allocator.Holder{Pid: self.Pid, Start: self.Start + 1} // the same pid, another start: gone
	gpu := func(i int) node.DeviceRef { return inv.Devices[i].Ref() }
	summary := func(id, owner string, sup *allocator.Holder, gpus ...node.DeviceRef) container.Summary {
		raw, _ := json.Marshal(gpus)
		labels := map[string]string{docker.LabelNamespace: "ns", dockerconfig.LabelOwner: owner, dockerconfig.LabelGPUs: string(raw)}
		if sup != nil {
			labels[docker.LabelSupervisor] = supervisorLabel(*sup)
		}
		return container.Summary{ID: id, Labels: labels, State: container.StateRunning}
	}
	type held map[string][]int // owner -> GPU indexes
	cases := []struct {
		name       string
		containers []container.Summary
		before     map[string]allocator.Request // allocations before Clean
		wantClean  []string
		wantRemove []string
		wantHeld   held
		wantErr    error
	}{
		{name: "dead supervisor's container is removed and its gpus given back",
			containers: []container.Summary{summary("c1", "run-1", &dead, gpu(1), gpu(2))},
			before:     map[string]allocator.Request{"run-1": {Devices: []string{"1", "2"}, Holder: &dead}},
			wantClean:  []string{"run-1"}, wantRemove: []string{"c1"}, wantHeld: held{}},
		{name: "dead supervisor, allocation already lost",
			containers: []container.Summary{summary("c1", "run-1", &dead, gpu(1))},
			wantClean:  []string{"run-1"}, wantRemove: []string{"c1"}, wantHeld: held{}},
		{name: "owner whose holder died, container without supervisor label",
			containers: []container.Summary{summary("c1", "run-1", nil, gpu(3))},
			before:     map[string]allocator.Request{"run-1": {Devices: []string{"3"}, Holder: &dead}},
			wantClean:  []string{"run-1"}, wantRemove: []string{"c1"}, wantHeld: held{}},
		{name: "owner whose holder died before it made a container",
			before:    map[string]allocator.Request{"run-1": {Devices: []string{"3"}, Holder: &dead}, "agent": {Devices: []string{"4"}}},
			wantClean: []string{"run-1"}, wantHeld: held{"agent": {4}}},
		{name: "live supervisor's container: gpus claimed again when lost",
			containers: []container.Summary{summary("c1", "run-2", &live, gpu(5), gpu(0))},
			wantHeld:   held{"run-2": {0, 5}}},
		{name: "live supervisor's container: gpus already held",
			containers: []container.Summary{summary("c1", "run-2", &live, gpu(5), gpu(0))},
			before:     map[string]allocator.Request{"run-2": {Devices: []string{"0", "5"}, Holder: &live}},
			wantHeld:   held{"run-2": {0, 5}}},
		{name: "live supervisor's gpus held by another owner",
			containers: []container.Summary{summary("c1", "run-2", &live, gpu(5)), summary("c2", "run-3", &dead, gpu(6))},
			before:     map[string]allocator.Request{"thief": {Devices: []string{"5"}}},
			wantClean:  []string{"run-3"}, wantRemove: []string{"c2"}, wantHeld: held{"thief": {5}}, wantErr: allocator.ErrDeviceUnavailable},
		{name: "agent's and own containers are left alone",
			containers: []container.Summary{summary("c1", "agent", nil, gpu(1)), summary("c2", "mine", &self, gpu(2))},
			before:     map[string]allocator.Request{"agent": {Devices: []string{"1"}}, "mine": {Devices: []string{"2"}, Holder: &self}},
			wantHeld:   held{"agent": {1}, "mine": {2}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			alloc, err := allocator.New(inv, allocator.WithStateDir(t.TempDir()))
			if err != nil {
				t.Fatal(err)
			}
			defer alloc.Close()
			for owner, req := range tc.before {
				if _, err := alloc.Allocate(ctx, owner, req); err != nil {
					t.Fatal(err)
				}
			}
			fake := &listDaemon{containers: tc.containers}
			z, err := docker.New(fake, alloc, docker.WithNamespace("ns"), docker.WithSupervisor(self))
			if err != nil {
				t.Fatal(err)
			}
			cleaned, err := z.Clean(ctx)
			if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("clean: %v, want %v", err, tc.wantErr)
			}
			if !slices.Equal(cleaned, tc.wantClean) {
				t.Errorf("cleaned %v, want %v", cleaned, tc.wantClean)
			}
			if !slices.Equal(fake.removed, tc.wantRemove) {
				t.Errorf("removed %v, want %v", fake.removed, tc.wantRemove)
			}
			got := held{}
			for _, al := range alloc.Allocations() {
				for _, d := range al.Devices {
					got[al.Owner] = append(got[al.Owner], d.Index)
				}
			}
			if len(got) != len(tc.wantHeld) {
				t.Fatalf("held %v, want %v", got, tc.wantHeld)
			}
			for owner, want := range tc.wantHeld {
				if !slices.Equal(got[owner], want) {
					t.Errorf("%s holds %v, want %v", owner, got[owner], want)
				}
			}
			// A claimed allocation ends with its supervisor.
			if al, err := alloc.Allocation("run-2"); err == nil && (al.Holder == nil || *al.Holder != live) {
				t.Errorf("run-2's GPUs are held by %+v, want its supervisor %+v", al.Holder, live)
			}
			// Clean again: nothing more to do.
			again, err := z.Clean(ctx)
			if len(again) != 0 || (tc.wantErr == nil && err != nil) {
				t.Errorf("second clean: %v, %v", again, err)
			}
		})
	}
}

// TestSupervisorRejected: WithSupervisor refuses a process that is not one.
func TestSupervisorRejected(t *testing.T) {
	sim, _ := simnode.New("pcie8")
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(sim.NVML()))
	if err != nil {
		t.Fatal(err)
	}
	alloc, _ := allocator.New(inv)
	for _, h := range []allocator.Holder{{}, {Pid: 1}, {Start: 1}, {Pid: -1, Start: 1}} {
		if _, err := docker.New(&listDaemon{}, alloc, docker.WithSupervisor(h)); !errors.Is(err, allocator.ErrInvalidRequest) {
			t.Errorf("WithSupervisor(%+v): %v", h, err)
		}
	}
}

// TestRecoverSupervised: Recover adopts the containers of dead supervisors
// (an agent that restarted) and its own, and leaves those of another live
// supervisor to it, their GPUs claimed. No daemon needed.
func TestRecoverSupervised(t *testing.T) {
	ctx := context.Background()
	sim, _ := simnode.New("dgx1-volta")
	inv, err := nvmlnode.Discover(ctx, nvmlnode.WithNVML(sim.NVML()))
	if err != nil {
		t.Fatal(err)
	}
	self, _ := allocator.ProcessHolder("", os.Getpid())
	live, err := allocator.ProcessHolder("", os.Getppid())
	if err != nil {
		t.Fatal(err)
	}
	dead := allocator.Holder{Pid: self.Pid, Start: self.Start + 1}
	mk := func(id, owner string, sup allocator.Holder, gpu int) container.Summary {
		raw, _ := json.Marshal([]node.DeviceRef{inv.Devices[gpu].Ref()})
		return container.Summary{ID: id, State: container.StateRunning, Labels: map[string]string{
			docker.LabelNamespace: "ns", dockerconfig.LabelOwner: owner, dockerconfig.LabelGPUs: string(raw),
			docker.LabelSupervisor: supervisorLabel(sup)}}
	}
	alloc, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	fake := &listDaemon{containers: []container.Summary{mk("c1", "old", dead, 1), mk("c2", "other", live, 2), mk("c3", "mine", self, 3)}}
	z, err := docker.New(fake, alloc, docker.WithNamespace("ns"), docker.WithSupervisor(self))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := z.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	if !slices.Equal(ids, []string{"mine", "old"}) {
		t.Errorf("adopted %v, want mine and old", ids)
	}
	for owner, gpu := range map[string]int{"old": 1, "other": 2, "mine": 3} {
		al, err := alloc.Allocation(owner)
		if err != nil || len(al.Devices) != 1 || al.Devices[0].Index != gpu {
			t.Errorf("%s holds %+v, %v; want gpu %d", owner, al.Devices, err, gpu)
		}
	}
	if len(fake.removed) != 0 {
		t.Errorf("Recover removed %v", fake.removed)
	}
}

// TestRuntimeInLifecycle: the Docker Runtime names its containers'
// supervisor (WithSupervisor) to a Lifecycle over it, which refuses
// another; New is a Lifecycle over one Runtime and its allocator. No
// daemon needed.
func TestRuntimeInLifecycle(t *testing.T) {
	sim, _ := simnode.New("pcie8")
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(sim.NVML()))
	if err != nil {
		t.Fatal(err)
	}
	alloc, _ := allocator.New(inv)
	self, err := allocator.ProcessHolder("", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	parent, err := allocator.ProcessHolder("", os.Getppid())
	if err != nil {
		t.Fatal(err)
	}
	rt, err := docker.NewRuntime(&listDaemon{}, docker.WithNamespace("ns"), docker.WithSupervisor(self))
	if err != nil {
		t.Fatal(err)
	}
	if sup := rt.Supervisor(); sup == nil || *sup != self {
		t.Fatalf("supervisor %+v, want %+v", sup, self)
	}
	if _, err := containerizer.NewLifecycle(containerizer.LifecycleConfig{Runtime: rt, Allocator: alloc, Supervisor: &self}); err != nil {
		t.Fatalf("a lifecycle with the same supervisor: %v", err)
	}
	if _, err := containerizer.NewLifecycle(containerizer.LifecycleConfig{Runtime: rt, Allocator: alloc, Supervisor: &parent}); !errors.Is(err, node.ErrInvalid) {
		t.Fatalf("a lifecycle with another supervisor: %v", err)
	}
	z, err := docker.New(&listDaemon{}, alloc, docker.WithNamespace("ns"))
	if err != nil || z.Allocator() != alloc {
		t.Fatalf("new: %v", err)
	}
}
