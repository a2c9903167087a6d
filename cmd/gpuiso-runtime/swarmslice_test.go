package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// testSwarm are the Swarm resources the request tests read: the defaults,
// with GPUs split in 4 slices for the slice resource (--swarm-slices 4).
func testSwarm() swarmNames {
	return swarmNames{GPUs: defaultSwarmResources, Memory: defaultSwarmMemoryResource, Slice: defaultSwarmSliceResource, Slices: 4}
}

// TestRequestSwarmSlice: the slice resource Swarm assigned a task
// (DOCKER_RESOURCE_NVIDIA-GPU-SLICE=<GPU>::<k>) asks for one of
// --swarm-slices concurrent slices of the GPU its id names, trusted as
// Swarm's GPUs are: only in a Docker Swarm task, only with a value that is
// not the image's own. Several ids, an id not of that form or past the
// count, a count not set, or a slice beside Swarm's whole GPUs, its memory
// resource or another kind of share is ErrInvalidShare.
func TestRequestSwarmSlice(t *testing.T) {
	const key = "DOCKER_RESOURCE_NVIDIA-GPU-SLICE"
	spec := func(env ...string) *specs.Spec { return &specs.Spec{Process: &specs.Process{Env: env}} }
	taskLabels := map[string]string{swarmTaskLabel: "t1"}
	task := &engineRecord{Engine: "docker", ImageEnv: []string{"NVIDIA_VISIBLE_DEVICES=all"}, Labels: taskLabels}
	plain := &engineRecord{Engine: "docker"}
	taskImageSlice := &engineRecord{Engine: "docker", ImageEnv: []string{key + "=GPU-a::0"}, Labels: taskLabels}
	spoofed := &engineRecord{Engine: "docker", ImageEnv: []string{key + "=GPU-a::0"}, ImageLabels: taskLabels, Labels: taskLabels}
	podmanTask := &engineRecord{Engine: "podman", Labels: taskLabels}
	slice := func(n int) *allocator.Share { return &allocator.Share{Mode: allocator.ShareSlice, Slices: n} }
	for _, tc := range []struct {
		name    string
		policy  AcceptEnv
		swarm   *swarmNames // nil: testSwarm()
		spec    *specs.Spec
		rec     *engineRecord // nil: no record
		want    *allocator.Share
		ids     []string
		source  string
		ignored string
		err     string // in the error, which is ErrInvalidShare
	}{
		{name: "by UUID", spec: spec("NVIDIA_VISIBLE_DEVICES=all", key+"=GPU-a::2"), rec: task, want: slice(4), ids: []string{"GPU-a"}, source: key, ignored: "NVIDIA_VISIBLE_DEVICES=all: the image's own"},
		{name: "by index", spec: spec(key + "=1::0"), rec: task, want: slice(4), ids: []string{"1"}, source: key},
		{name: "spaces around the id", spec: spec(key + "= GPU-a::3 "), rec: task, want: slice(4), ids: []string{"GPU-a"}, source: key},
		{name: "over the caller's devices", spec: spec(key+"=GPU-a::1", "NVIDIA_VISIBLE_DEVICES=3"), rec: plainTask(), want: slice(4), ids: []string{"GPU-a"}, source: key},
		{name: "caller's memory ignored", spec: spec(key+"=GPU-a::1", "GPUISO_GPU_MEMORY=1GiB"), rec: task, want: slice(4), ids: []string{"GPU-a"}, source: key, ignored: "GPUISO_GPU_MEMORY=1GiB: " + key + " asks already"},
		{name: "another resource name", swarm: &swarmNames{GPUs: defaultSwarmResources, Slice: "gpu-part", Slices: 2}, spec: spec("DOCKER_RESOURCE_GPU-PART=GPU-b::1"), rec: task, want: slice(2), ids: []string{"GPU-b"}, source: "DOCKER_RESOURCE_GPU-PART"},
		{name: "the name as given is not Swarm's", swarm: &swarmNames{GPUs: defaultSwarmResources, Slice: "gpu-part", Slices: 2}, spec: spec("DOCKER_RESOURCE_gpu-part=GPU-b::1"), rec: task},
		{name: "no slice resource", swarm: &swarmNames{GPUs: defaultSwarmResources}, spec: spec(key + "=GPU-a::0"), rec: task},
		{name: "48 slices", swarm: &swarmNames{Slice: defaultSwarmSliceResource, Slices: 48}, spec: spec(key + "=GPU-a::47"), rec: task, want: slice(48), ids: []string{"GPU-a"}, source: key},
		{name: "always, no record", policy: AcceptAlways, spec: spec(key + "=GPU-a::0"), want: slice(4), ids: []string{"GPU-a"}, source: key},
		{name: "never keeps swarm", policy: AcceptNever, spec: spec(key + "=GPU-a::0"), rec: task, want: slice(4), ids: []string{"GPU-a"}, source: key},

		{name: "not a swarm task", spec: spec(key + "=GPU-a::0"), rec: plain, ignored: key + ": not a Docker Swarm task"},
		{name: "podman with a task label", spec: spec(key + "=GPU-a::0"), rec: podmanTask, ignored: key + ": not a Docker Swarm task"},
		{name: "task label from the image", spec: spec(key + "=GPU-a::0"), rec: spoofed, ignored: key + ": not a Docker Swarm task"},
		{name: "no record", spec: spec(key + "=GPU-a::0"), ignored: key + ": no Docker record shows a Swarm task"},
		{name: "image's own id", spec: spec(key + "=GPU-a::0"), rec: taskImageSlice, ignored: key + ": the image's own"},
		{name: "image's own bad id", spec: spec(key + "=GPU-a"), rec: &engineRecord{Engine: "docker", ImageEnv: []string{key + "=GPU-a"}, Labels: taskLabels}, ignored: key + ": the image's own"},
		{name: "image's id under Swarm's", spec: spec(key + "=GPU-b::1"), rec: taskImageSlice, want: slice(4), ids: []string{"GPU-b"}, source: key},
		{name: "image's invalid id, not a task", spec: spec(key + "=nonsense"), rec: plain, ignored: key + ": not a Docker Swarm task"},

		{name: "two slices of a GPU", spec: spec(key + "=GPU-a::0,GPU-a::1"), rec: task, err: "Swarm assigned 2 slices, and a task takes one"},
		{name: "slices of two GPUs", spec: spec(key + "=GPU-a::0,GPU-b::0"), rec: task, err: "Swarm assigned 2 slices"},
		{name: "count not set", swarm: &swarmNames{Slice: defaultSwarmSliceResource}, spec: spec(key + "=GPU-a::0"), rec: task, err: "--swarm-slices N"},
		{name: "no slice number", spec: spec(key + "=GPU-a"), rec: task, err: `"GPU-a" is no <GPU>::<slice> id`},
		{name: "one colon", spec: spec(key + "=GPU-a:1"), rec: task, err: "is no <GPU>::<slice> id"},
		{name: "empty", spec: spec(key + "="), rec: task, err: "is no <GPU>::<slice> id"},
		{name: "slice past the count", spec: spec(key + "=GPU-a::4"), rec: task, err: `slice "4": want a number from 0 to 3 (--swarm-slices 4)`},
		{name: "negative slice", spec: spec(key + "=GPU-a::-1"), rec: task, err: "want a number from 0 to 3"},
		{name: "signed slice", spec: spec(key + "=GPU-a::+1"), rec: task, err: "want a number from 0 to 3"},
		{name: "no slice after the separator", spec: spec(key + "=GPU-a::"), rec: task, err: "want a number from 0 to 3"},
		{name: "two separators", spec: spec(key + "=GPU-a::1::2"), rec: task, err: "want a number from 0 to 3"},
		{name: "huge slice", spec: spec(key + "=GPU-a::99999999999999999999999"), rec: task, err: "want a number from 0 to 3"},
		{name: "no GPU", spec: spec(key + "=::0"), rec: task, err: "its GPU: empty entry"},
		{name: "all", spec: spec(key + "=all::0"), rec: task, err: `its GPU: "all" names no one GPU`},
		{name: "none", spec: spec(key + "=none::0"), rec: task, err: `its GPU: "none" names no one GPU`},
		{name: "GPU index out of range", spec: spec(key + "=4096::0"), rec: task, err: "its GPU: index 4096 out of range"},
		{name: "MIG GPU:instance form", spec: spec(key + "=0:1::0"), rec: task, err: "its GPU: MIG device"},
		{name: "MIG device", spec: spec(key + "=MIG-abc::0"), rec: task, err: "MIG devices are not shared"},
		{name: "beside whole GPUs", spec: spec(key+"=GPU-a::0", "DOCKER_RESOURCE_NVIDIA-GPU=GPU-b"), rec: task, err: "a task takes a slice or whole GPUs"},
		{name: "beside its own GPU whole", spec: spec(key+"=GPU-a::0", "DOCKER_RESOURCE_GPU=GPU-a"), rec: task, err: "a task takes a slice or whole GPUs"},
		{name: "beside Swarm's memory", spec: spec(key+"=GPU-a::0", "DOCKER_RESOURCE_VRAM=4000"), rec: task, err: "beside DOCKER_RESOURCE_VRAM: a GPU is shared one way"},
		{name: "beside GPUISO_GPU_SLICES", spec: spec(key+"=GPU-a::0", "GPUISO_GPU_SLICES=4"), rec: task, err: "GPUISO_GPU_SLICES=\"4\" beside " + key},
		{name: "beside a time slice", spec: spec(key+"=GPU-a::0", "GPUISO_GPU_TIME_SLICE=1"), rec: task, err: "a GPU is shared one way"},
		{name: "with a compute percentage", spec: spec(key+"=GPU-a::0", "GPUISO_GPU_COMPUTE=50"), rec: task, err: "GPUISO_GPU_COMPUTE=50 without a memory share"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policy := tc.policy
			if policy == "" {
				policy = AcceptCaller
			}
			sw := testSwarm()
			if tc.swarm != nil {
				sw = *tc.swarm
			}
			tr := &trust{Policy: policy, Load: func() (*engineRecord, error) {
				if tc.rec == nil {
					return nil, errors.New("no record here")
				}
				return tc.rec, nil
			}}
			r, err := requestOf(tc.spec, "nvidia.com/gpu", sw, tr)
			if tc.err != "" {
				if !errors.Is(err, ErrInvalidShare) || !strings.Contains(remedied(err), tc.err) {
					t.Fatalf("requestOf = %+v, %v; want ErrInvalidShare saying %q", r, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.want == nil && r.Share != nil:
				t.Errorf("share %+v from %q, want none", *r.Share, r.ShareSource)
			case tc.want != nil && (r.Share == nil || *r.Share != *tc.want || r.ShareSource != tc.source || r.Source != tc.source):
				t.Errorf("share %+v from %q (devices from %q), want %+v from %q", r.Share, r.ShareSource, r.Source, tc.want, tc.source)
			}
			if r.All || !slices.Equal(r.IDs, tc.ids) {
				t.Errorf("devices %+v, want %q", r.Devices, tc.ids)
			}
			if got := strings.Join(r.Ignored, "; "); tc.ignored == "" && got != "" || !strings.Contains(got, tc.ignored) {
				t.Errorf("ignored %q, want %q", got, tc.ignored)
			}
			if tc.want != nil {
				if al := r.allocation(nil); al.Share == nil || *al.Share != *tc.want || !slices.Equal(al.Devices, tc.ids) || al.Count != 0 {
					t.Errorf("allocation %+v", al)
				}
			}
		})
	}
}

// plainTask is a Swarm task whose image sets nothing.
func plainTask() *engineRecord {
	return &engineRecord{Engine: "docker", Labels: map[string]string{swarmTaskLabel: "t1"}}
}

// TestSwarmSliceRemedies: a refused slice says what to do about it: give
// the runtime --swarm-slices, ask the service for one slice, or advertise
// ids of the right form.
func TestSwarmSliceRemedies(t *testing.T) {
	const key = "DOCKER_RESOURCE_NVIDIA-GPU-SLICE"
	for _, tc := range []struct {
		v    string
		n    int
		want string
	}{
		{v: "GPU-a::0", n: 0, want: "give gpuiso-runtime --swarm-slices N, N the count of NVIDIA-GPU-SLICE ids the node advertises per GPU"},
		{v: "GPU-a::0,GPU-a::1", n: 4, want: "ask the service for one slice (--generic-resource NVIDIA-GPU-SLICE=1)"},
		{v: "GPU-a::7", n: 4, want: "advertise the node's slices as NVIDIA-GPU-SLICE=<GPU index or GPU- UUID>::<k>, k from 0 to 3"},
	} {
		_, _, err := parseSwarmSlice(key, tc.v, tc.n)
		if !errors.Is(err, ErrInvalidShare) || !strings.HasSuffix(refusal(err), tc.want) {
			t.Errorf("%s=%s with %d slices: %q, want it to end with %q", key, tc.v, tc.n, refusal(err), tc.want)
		}
	}
}

// FuzzSwarmSlice: any value of Swarm's slice resource, beside any of its
// GPU and memory resources, gives one concurrent slice of --swarm-slices
// of the one GPU its id names, or ErrInvalidShare, never a panic.
func FuzzSwarmSlice(f *testing.F) {
	for _, s := range [][3]string{{"GPU-a::0", "", ""}, {"0::3", "", ""}, {"GPU-a::0,GPU-a::1", "", ""}, {"GPU-a::4", "", ""}, {"::", "", ""}, {"MIG-x::0", "", ""},
		{"GPU-a::1", "GPU-b", ""}, {"GPU-a::1", "", "4000"}, {" 1::2 ", "", ""}, {"1:2::0", "", ""}, {"GPU-a::1::2", "", ""}} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, slice, gpus, vram string) {
		env := []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE=" + slice}
		if gpus != "" {
			env = append(env, "DOCKER_RESOURCE_NVIDIA-GPU="+gpus)
		}
		if vram != "" {
			env = append(env, "DOCKER_RESOURCE_VRAM="+vram)
		}
		r, err := requestOf(&specs.Spec{Process: &specs.Process{Env: env}}, "nvidia.com/gpu", testSwarm(), &trust{Policy: AcceptAlways})
		if err != nil {
			if !errors.Is(err, ErrInvalidShare) && !errors.Is(err, ErrInvalidDevices) {
				t.Fatalf("%q: %v is no ErrInvalidShare", env, err)
			}
			return
		}
		if r.Share == nil || r.Share.Mode != allocator.ShareSlice || r.Share.Slices != 4 || r.Share.Validate() != nil || len(r.IDs) != 1 || r.All {
			t.Fatalf("%q: share %+v, devices %+v", env, r.Share, r.Devices)
		}
		if err := validID(r.IDs[0]); err != nil || strings.HasPrefix(r.IDs[0], "MIG-") || !strings.HasPrefix(strings.TrimSpace(slice), r.IDs[0]+sliceIDSep) {
			t.Fatalf("%q: GPU %q: %v", env, r.IDs[0], err)
		}
	})
}

// TestSwarmSlice runs services on a one-node swarm whose daemon advertises
// GPU 0 of a simulated dgx1-volta (a 16 GiB V100, --shared-gpus 0) as two
// named generic resources, NVIDIA-GPU-SLICE=<its UUID>::0 and ::1, and
// whose runtime splits GPUs in two (--swarm-slices 2): two services asking
// --generic-resource NVIDIA-GPU-SLICE=1 get the two ids and run as
// concurrent slices of GPU 0 under the GPU's one MPS daemon, each seeing
// only GPU 0, half its memory and half its threads
// (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M,
// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50) and the daemon's pipe directory;
// a third waits pending until one ends, then runs under the same daemon. A
// service asking for two slices is refused by the runtime, saying why,
// with nothing claimed. After the services end, no daemon, record or
// allocation is left.
func TestSwarmSlice(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireNVIDIALibraries(t)
	testenv.RequireSimulatedMPS(t)
	bin := buildRuntime(t)
	sim, major, gpus := simNode(t, "dgx1-volta")
	n, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	host := &simnode.Host{Root: sim, DevRoot: sim + "/dev", ProcRoot: sim + "/proc", SysRoot: sim + "/sys"}
	inv, err := nvmlnode.Discover(context.Background(), n.DiscoverOptions(host)...)
	if err != nil {
		t.Fatal(err)
	}
	uuid := inv.Devices[0].UUID
	ids := []string{uuid + "::0", uuid + "::1"}
	state := t.TempDir()
	stopDaemonsAtEnd(t, state)
	d, img := gpuisoDockerd(t, bin, map[string]any{"default-runtime": "gpuiso", "node-generic-resources": []string{"NVIDIA-GPU-SLICE=" + ids[0], "NVIDIA-GPU-SLICE=" + ids[1]}},
		"--simulate", "dgx1-volta", "--dev-root", sim, "--state-dir", state, "--shared-gpus", "0", "--swarm-slices", "2")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if err := d.SwarmInit(ctx, freePort(t)); err != nil {
		t.Fatal(err)
	}
	if out, err := d.Docker(ctx, "node", "inspect", "self", "--format", "{{json .Description.Resources.GenericResources}}"); err != nil || strings.Count(out, `"Kind":"NVIDIA-GPU-SLICE"`) != 2 {
		t.Fatalf("the node does not advertise two NVIDIA-GPU-SLICE ids: %v\n%s", err, out)
	}
	service := func(name string, count int) {
		t.Helper()
		args := []string{"service", "create", "--detach", "--no-resolve-image", "--name", name, "--restart-condition", "none",
			"--stop-grace-period", "1s", "--generic-resource", fmt.Sprintf("NVIDIA-GPU-SLICE=%d", count), img,
			"do", "env", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PIPE_DIRECTORY", "--", "ls", "/tmp/nvidia-mps", "--"}
		args = append(append(args, probeArgs(major, gpus)[1:]...), "--", "sleep", "600")
		if _, err := d.Docker(ctx, args...); err != nil {
			t.Fatal(err)
		}
	}
	type task struct {
		id, slice string
		pid       int
	}
	// running waits for the task of service name to have run the probe,
	// checks what it sees, and returns it.
	running := func(name string) task {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
			id, err := d.Docker(ctx, "ps", "-q", "--no-trunc", "--filter", "label=com.docker.swarm.service.name="+name)
			if err != nil || strings.TrimSpace(id) == "" {
				continue
			}
			id = strings.Fields(id)[0]
			logs, err := d.Docker(ctx, "logs", id)
			if err != nil || !strings.Contains(logs, "/usr/local/nvidia/x ") {
				continue
			}
			checkIsolation(t, logs, gpus, Expect{GPUs: []int{0}, Control: true, Volume: true})
			for _, want := range []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "control", "control_lock"} {
				if !strings.Contains(logs, want+"\n") {
					t.Errorf("service %s sees no %q:\n%s", name, want, logs)
				}
			}
			out, err := d.Docker(ctx, "inspect", "--format", `{{println .State.Pid}}{{range .Config.Env}}{{println .}}{{end}}`, id)
			if err != nil {
				t.Fatal(err)
			}
			pid, err := strconv.Atoi(strings.Fields(out)[0])
			if err != nil {
				t.Fatal(err)
			}
			var slice string
			for l := range strings.Lines(out) {
				if v, ok := strings.CutPrefix(strings.TrimSpace(l), "DOCKER_RESOURCE_NVIDIA-GPU-SLICE="); ok {
					slice = v
				}
			}
			if !slices.Contains(ids, slice) {
				t.Errorf("service %s: Swarm assigned %q, want one of %q", name, slice, ids)
			}
			var owner string
			for o, held := range owners(t, state) {
				if strings.HasPrefix(o, id+".") {
					owner = o
					if !slices.Equal(held, []int{0}) {
						t.Errorf("service %s holds GPUs %v, want a slice of GPU 0", name, held)
					}
				}
			}
			if owner == "" {
				t.Fatalf("service %s (container %s) holds nothing: %v", name, id, owners(t, state))
			}
			return task{id: id, slice: slice, pid: pid}
		}
		out, _ := d.Docker(ctx, "service", "ps", "--no-trunc", name)
		t.Fatalf("service %s: no task ran the probe in 2 min:\n%s", name, out)
		return task{}
	}
	// daemon returns the one MPS daemon of the state directory, which must
	// be the one of GPU 0's two slices.
	daemon := func() mps.Daemon {
		t.Helper()
		list, err := mps.Daemons(ctx, filepath.Join(state, daemonsDir))
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 1 || list[0].Slices != 2 || list[0].Index != 0 || list[0].Owner != mps.SliceOwner(uuid) || !list[0].Alive {
			t.Fatalf("daemons %+v: want the one of GPU 0's 2 slices", list)
		}
		return list[0]
	}
	// pending waits until service name's task is pending for resources,
	// with no container.
	pending := func(name string) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(250 * time.Millisecond) {
			st, err := d.Docker(ctx, "service", "ps", "--no-trunc", "--format", "{{.CurrentState}} {{.Error}}", name)
			if err == nil && strings.HasPrefix(st, "Pending") && strings.Contains(st, "insufficient resources") {
				break
			}
			if time.Now().After(deadline) {
				all, _ := d.Docker(ctx, "service", "ps", "--no-trunc", name)
				t.Fatalf("service %s: %v\n%q\n%s", name, err, st, all)
			}
		}
		if ids, _ := d.Docker(ctx, "ps", "-aq", "--filter", "label=com.docker.swarm.service.name="+name); strings.TrimSpace(ids) != "" {
			t.Errorf("the pending service %s has containers: %s", name, ids)
		}
	}
	// gone waits until the container of tk is removed and holds nothing.
	gone := func(tk task) {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
			ids, err := d.Docker(ctx, "ps", "-aq", "--no-trunc")
			held := slices.ContainsFunc(slices.Collect(maps.Keys(owners(t, state))), func(o string) bool { return strings.HasPrefix(o, tk.id+".") })
			if err == nil && !strings.Contains(ids, tk.id) && !held {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("container %s: removed %v, still holding %v", tk.id, !strings.Contains(ids, tk.id), held)
			}
		}
	}

	service("one", 1)
	one := running("one")
	service("two", 1)
	two := running("two")
	if one.slice == two.slice {
		t.Errorf("services one and two were both assigned %q", one.slice)
	}
	dm := daemon()
	expectShare(t, one.pid, dm, 8192) // 16 GiB in 2
	expectShare(t, two.pid, dm, 8192)

	// Both ids assigned: a third waits, then runs under the same daemon.
	service("three", 1)
	pending("three")
	if _, err := d.Docker(ctx, "service", "rm", "one"); err != nil {
		t.Fatal(err)
	}
	gone(one)
	three := running("three")
	if three.slice != one.slice {
		t.Errorf("service three was assigned %q, want the one service one gave back, %q", three.slice, one.slice)
	}
	if still := daemon(); still.Pid != dm.Pid {
		t.Errorf("the slices' daemon changed from %d to %d while a slice held it", dm.Pid, still.Pid)
	}
	expectShare(t, three.pid, dm, 8192)

	if _, err := d.Docker(ctx, "service", "rm", "two", "three"); err != nil {
		t.Fatal(err)
	}
	gone(two)
	gone(three)
	expectDaemonGone(t, dm)

	// Two slices in one task: the runtime refuses it, saying why, and
	// claims nothing.
	service("pair", 2)
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
		st, err := d.Docker(ctx, "service", "ps", "--no-trunc", "--format", "{{.CurrentState}} {{.Error}}", "pair")
		if err == nil && strings.Contains(st, "Swarm assigned 2 slices, and a task takes one") {
			break
		}
		if time.Now().After(deadline) {
			all, _ := d.Docker(ctx, "service", "ps", "--no-trunc", "pair")
			t.Fatalf("service pair (2 slices): %v\n%q\n%s", err, st, all)
		}
	}
	if _, err := d.Docker(ctx, "service", "rm", "pair"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(250 * time.Millisecond) {
		list, err := mps.Daemons(ctx, filepath.Join(state, daemonsDir))
		if err == nil && len(list) == 0 && len(owners(t, state)) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the services: daemons %+v (%v), allocations %v", list, err, owners(t, state))
		}
	}
	if left, _ := filepath.Glob(filepath.Join(state, recordsDir, "*.json")); len(left) != 0 {
		t.Errorf("container records left: %q", left)
	}
}

// TestSwarmNamesAnyCase: Swarm writes a generic resource's variable with
// the name upper-cased, so --swarm-resource and --swarm-memory-resource
// given in lower case still read what Swarm assigned.
func TestSwarmNamesAnyCase(t *testing.T) {
	spec := &specs.Spec{Process: &specs.Process{Env: []string{"DOCKER_RESOURCE_GPU=GPU-a", "DOCKER_RESOURCE_VRAM=2048"}}}
	tr := &trust{Policy: AcceptCaller, Load: func() (*engineRecord, error) { return plainTask(), nil }}
	r, err := requestOf(spec, "nvidia.com/gpu", swarmNames{GPUs: []string{"gpu"}, Memory: "vram"}, tr)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.IDs, []string{"GPU-a"}) || r.Source != "DOCKER_RESOURCE_GPU" {
		t.Errorf("devices %+v from %q, want GPU-a from DOCKER_RESOURCE_GPU", r.Devices, r.Source)
	}
	if r.Share == nil || r.Share.MemoryBytes != 2048<<20 || r.ShareSource != "DOCKER_RESOURCE_VRAM" {
		t.Errorf("share %+v from %q, want 2 GiB from DOCKER_RESOURCE_VRAM", r.Share, r.ShareSource)
	}
}
