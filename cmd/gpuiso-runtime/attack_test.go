package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// What an image can try against the runtime, as Podman and Docker run it:
// its own environment asking for GPUs, and files in its CUDA compat
// directory that are no library (a FIFO, a device, a link to a host
// folder). And what a caller can try with runc: a GPU another container
// owns passed as a device, a state directory whose lock is held.

// imageEntry is a file of a test image beside the probe.
type imageEntry struct {
	hdr  tar.Header
	body []byte
}

// imageTar writes the root file system of a test image, the probe at
// /probe and entries, as a tar, and returns its path.
func imageTar(t *testing.T, entries ...imageEntry) string {
	t.Helper()
	probe, err := os.ReadFile(testenv.BuildProbe(t))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	all := append([]imageEntry{{hdr: tar.Header{Name: "probe", Mode: 0o755, Typeflag: tar.TypeReg}, body: probe}}, entries...)
	for _, e := range all {
		h := e.hdr
		h.Size = int64(len(e.body))
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "rootfs.tar")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// dirs are the entries of the directories of path, parents first.
func dirs(path string) []imageEntry {
	var out []imageEntry
	for d := filepath.Dir(path); d != "."; d = filepath.Dir(d) {
		out = append([]imageEntry{{hdr: tar.Header{Name: d + "/", Mode: 0o755, Typeflag: tar.TypeDir}}}, out...)
	}
	return out
}

// engine runs images it imports through gpuiso-runtime on a simulated
// 8-GPU node with one state directory.
type engine struct {
	name string
	// image imports a root file system tar with env as its own
	// environment and returns its name.
	image func(ctx context.Context, t *testing.T, tarPath string, env ...string) string
	// load loads a root file system tar as an image whose configuration
	// holds env byte for byte (an import's ENV would be parsed as a
	// Dockerfile's), and returns its name.
	load func(ctx context.Context, t *testing.T, tarPath string, env ...string) string
	// run runs image with flags and the probe's args, removing it after.
	run func(ctx context.Context, image string, flags []string, args ...string) (string, error)
	// log returns what gpuiso-runtime logged ("" where it cannot be read).
	log func() string
}

// attackRig is a simulated node, a state directory and gpuiso-runtime.
type attackRig struct {
	bin, sim, state string
	major           uint32
	gpus            int
}

func newAttackRig(t *testing.T) *attackRig {
	t.Helper()
	testenv.RequireNVIDIALibraries(t)
	r := &attackRig{bin: buildRuntime(t), state: t.TempDir()}
	r.sim, r.major, r.gpus = simNode(t, "dgx1-volta")
	return r
}

// podman is Podman running containers through r's runtime.
func (r *attackRig) podman(t *testing.T) engine {
	podman := testenv.RequirePodman(t)
	logFile := filepath.Join(t.TempDir(), "runtime.log")
	return engine{
		name: "podman",
		image: func(ctx context.Context, t *testing.T, tarPath string, env ...string) string {
			t.Helper()
			name := fmt.Sprintf("localhost/gpuiso-attack:%s-%d", strings.ToLower(strings.NewReplacer("/", "-", " ", "-", "'", "").Replace(t.Name())), time.Now().UnixNano())
			args := []string{"import", "--change", `ENTRYPOINT ["/probe"]`}
			for _, e := range env {
				args = append(args, "--change", "ENV "+e)
			}
			if _, err := testenv.RunPodman(ctx, podman, append(args, tarPath, name)...); err != nil {
				t.Fatalf("import: %v", err)
			}
			t.Cleanup(func() { testenv.RunPodman(context.Background(), podman, "rmi", "--force", name) })
			return name
		},
		load: func(ctx context.Context, t *testing.T, tarPath string, env ...string) string {
			t.Helper()
			name := fmt.Sprintf("localhost/gpuiso-attack:loaded-%d", time.Now().UnixNano())
			if _, err := testenv.RunPodman(ctx, podman, "load", "--input", imageArchive(t, tarPath, name, env)); err != nil {
				t.Fatalf("load: %v", err)
			}
			t.Cleanup(func() { testenv.RunPodman(context.Background(), podman, "rmi", "--force", name) })
			return name
		},
		run: func(ctx context.Context, image string, flags []string, args ...string) (string, error) {
			a := append([]string{"run", "--rm", "--network", "none", "--cap-add", "MKNOD", "--runtime", r.bin,
				"--runtime-flag", "simulate=dgx1-volta", "--runtime-flag", "dev-root=" + r.sim,
				"--runtime-flag", "state-dir=" + r.state, "--runtime-flag", "swarm-slices=4", "--runtime-flag", "log=" + logFile}, testenv.PodmanRunFlags...)
			a = append(append(a, flags...), image)
			return testenv.RunPodman(ctx, podman, append(a, args...)...)
		},
		log: func() string { b, _ := os.ReadFile(logFile); return string(b) },
	}
}

// docker is a Docker daemon (Debian's, with a graph driver) started for
// the test, running containers through r's runtime.
func (r *attackRig) docker(t *testing.T) engine {
	testenv.RequireRoot(t)
	d, _ := gpuisoDockerd(t, r.bin, nil, "--simulate", "dgx1-volta", "--dev-root", r.sim, "--state-dir", r.state, "--swarm-slices", "4")
	return r.dockerEngine(d)
}

// currentDocker is a current Docker daemon (the containerd image store)
// started for the test, running containers through r's runtime.
func (r *attackRig) currentDocker(t *testing.T) engine {
	dir := testenv.RequireCurrentDocker(t)
	d := testenv.StartDockerdWith(t, testenv.DockerdOptions{
		Binary: filepath.Join(dir, "dockerd"),
		Path:   []string{dir},
		Config: map[string]any{"runtimes": map[string]any{"gpuiso": map[string]any{"path": r.bin,
			"runtimeArgs": []string{"--simulate", "dgx1-volta", "--dev-root", r.sim, "--state-dir", r.state, "--swarm-slices", "4"}}}},
	})
	return r.dockerEngine(d)
}

// dockerEngine runs containers on d through its runtime "gpuiso".
func (r *attackRig) dockerEngine(d *testenv.Dockerd) engine {
	return engine{
		name: "docker",
		image: func(ctx context.Context, t *testing.T, tarPath string, env ...string) string {
			t.Helper()
			name := fmt.Sprintf("gpuiso-attack-%d", time.Now().UnixNano())
			args := []string{"import", "--change", `ENTRYPOINT ["/probe"]`}
			for _, e := range env {
				args = append(args, "--change", "ENV "+e)
			}
			if _, err := d.Docker(ctx, append(args, tarPath, name)...); err != nil {
				t.Fatalf("import: %v", err)
			}
			return name
		},
		load: func(ctx context.Context, t *testing.T, tarPath string, env ...string) string {
			t.Helper()
			name := fmt.Sprintf("localhost/gpuiso-attack:loaded-%d", time.Now().UnixNano())
			if _, err := d.Docker(ctx, "load", "--input", imageArchive(t, tarPath, name, env)); err != nil {
				t.Fatalf("load: %v", err)
			}
			return name
		},
		run: func(ctx context.Context, image string, flags []string, args ...string) (string, error) {
			a := append([]string{"run", "--rm", "--network", "none", "--cap-add", "MKNOD", "--runtime", "gpuiso"}, flags...)
			return d.Docker(ctx, append(append(a, image), args...)...)
		},
		log: func() string { return "" },
	}
}

// imageArchive writes a docker-archive (docker save's format, which
// docker load and podman load read) of one image: the root file system tar
// as its layer, the probe as its entrypoint, env as its environment byte
// for byte, named name. It returns the archive's path.
func imageArchive(t *testing.T, rootfs, name string, env []string) string {
	t.Helper()
	layer, err := os.ReadFile(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	layerSum := sha256.Sum256(layer)
	layerHex := hex.EncodeToString(layerSum[:])
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH, "os": "linux",
		"config": map[string]any{"Env": env, "Entrypoint": []string{"/probe"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + layerHex}},
	})
	if err != nil {
		t.Fatal(err)
	}
	configSum := sha256.Sum256(config)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{"Config": configName, "RepoTags": []string{name}, "Layers": []string{layerHex + "/layer.tar"}}})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range []struct {
		name string
		body []byte
	}{{layerHex + "/", nil}, {layerHex + "/layer.tar", layer}, {configName, config}, {"manifest.json", manifest}} {
		h := &tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), Typeflag: tar.TypeReg}
		if strings.HasSuffix(f.name, "/") {
			h.Mode, h.Typeflag = 0o755, tar.TypeDir
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "image.tar")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// engines are the engines of the suite.
func (r *attackRig) engines(t *testing.T) map[string]func(*testing.T) engine {
	return map[string]func(*testing.T) engine{"podman": r.podman, "docker": r.docker, "current docker": r.currentDocker}
}

// TestImageEnvironmentIsNoRequest: an image's own NVIDIA_VISIBLE_DEVICES=all
// and DOCKER_RESOURCE_* (GPUs, and a Swarm slice) ask for nothing (no GPU, no driver volume, nothing
// claimed); the caller's -e NVIDIA_VISIBLE_DEVICES=1 gets GPU 1; the
// caller's -e NVIDIA_VISIBLE_DEVICES=void beats the image's
// DOCKER_RESOURCE_GPU.
func TestImageEnvironmentIsNoRequest(t *testing.T) {
	r := newAttackRig(t)
	tarPath := imageTar(t)
	for name, mk := range r.engines(t) {
		t.Run(name, func(t *testing.T) {
			e := mk(t)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			img := e.image(ctx, t, tarPath, "NVIDIA_VISIBLE_DEVICES=all", "DOCKER_RESOURCE_GPU=0,1", "DOCKER_RESOURCE_NVIDIA-GPU=2", "DOCKER_RESOURCE_NVIDIA-GPU-SLICE=0::0")
			for _, tc := range []struct {
				name  string
				flags []string
				want  Expect
			}{
				{name: "image's own", want: Expect{}},
				{name: "caller's GPU 1", flags: []string{"-e", "NVIDIA_VISIBLE_DEVICES=1"}, want: Expect{GPUs: []int{1}, Control: true, Volume: true}},
				{name: "caller's void", flags: []string{"-e", "NVIDIA_VISIBLE_DEVICES=void"}, want: Expect{}},
			} {
				t.Run(tc.name, func(t *testing.T) {
					out, err := e.run(ctx, img, tc.flags, probeArgs(r.major, r.gpus)...)
					if err != nil {
						t.Fatal(err)
					}
					checkIsolation(t, out, r.gpus, tc.want)
					if got := owners(t, r.state); len(got) != 0 {
						t.Errorf("owners %v after the container ended", got)
					}
				})
			}
			if log := e.log(); log != "" && !strings.Contains(log, "NVIDIA_VISIBLE_DEVICES=all: the image's own setting") {
				t.Errorf("the runtime's log does not say why the image's setting was ignored:\n%s", log)
			}
		})
	}
}

// TestImageEnvironmentKeys: an image whose environment names a request
// variable in a form the engine reads as that variable (Podman trims
// spaces and tabs from the front of a name, and fills a name without a
// value, or every name of a "PREFIX*", from its own caller's environment)
// asks for nothing: no GPU node, no share, no claim, the runtime saying
// why; a caller's -e NVIDIA_VISIBLE_DEVICES=1 beside it still gets GPU 1.
// The podman and docker processes run with NVIDIA_VISIBLE_DEVICES=0,1,
// GPUISO_GPU_MEMORY=4GiB and DOCKER_RESOURCE_NVIDIA-GPU-SLICE=0::1 in their
// environment, for the images that name the variables without a value.
func TestImageEnvironmentKeys(t *testing.T) {
	r := newAttackRig(t)
	tarPath := imageTar(t)
	t.Setenv("NVIDIA_VISIBLE_DEVICES", "0,1")
	t.Setenv("GPUISO_GPU_MEMORY", "4GiB")
	t.Setenv("DOCKER_RESOURCE_NVIDIA-GPU-SLICE", "0::1")
	images := []struct {
		name   string
		env    []string
		logged string // in the runtime's log (Podman)
	}{
		{name: "leading space", env: []string{" NVIDIA_VISIBLE_DEVICES=0,1"}, logged: "NVIDIA_VISIBLE_DEVICES=0,1: the image's own setting"},
		{name: "leading tab", env: []string{"\tNVIDIA_VISIBLE_DEVICES=0"}, logged: "NVIDIA_VISIBLE_DEVICES=0: the image's own setting"},
		{name: "key only", env: []string{"NVIDIA_VISIBLE_DEVICES"}, logged: "NVIDIA_VISIBLE_DEVICES=0,1: the image names NVIDIA_VISIBLE_DEVICES without a value"},
		{name: "prefix", env: []string{"NVIDIA_*", "GPUISO_*"}, logged: "the image names GPUISO_GPU_MEMORY without a value"},
		{name: "memory after a tab", env: []string{"\tGPUISO_GPU_MEMORY=4GiB"}, logged: "GPUISO_GPU_MEMORY=4GiB: the image's own setting"},
		{name: "swarm slice after spaces and a tab", env: []string{" \t DOCKER_RESOURCE_NVIDIA-GPU-SLICE=0::0"}, logged: "DOCKER_RESOURCE_NVIDIA-GPU-SLICE: not a Docker Swarm task"},
		{name: "swarm slice key only", env: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE"}, logged: "DOCKER_RESOURCE_NVIDIA-GPU-SLICE: not a Docker Swarm task"},
	}
	for name, mk := range r.engines(t) {
		t.Run(name, func(t *testing.T) {
			e := mk(t)
			for _, im := range images {
				t.Run(im.name, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
					defer cancel()
					img := e.load(ctx, t, tarPath, im.env...)
					out, err := e.run(ctx, img, nil, probeArgs(r.major, r.gpus)...)
					if err != nil {
						t.Fatal(err)
					}
					checkIsolation(t, out, r.gpus, Expect{})
					if strings.Contains(out, "CUDA_MPS_PIPE_DIRECTORY=") {
						t.Errorf("the container has an MPS daemon:\n%s", out)
					}
					if log := e.log(); log != "" && !strings.Contains(log, im.logged) {
						t.Errorf("the runtime's log does not say %q:\n%s", im.logged, log)
					}
					if len(im.env) == 1 && strings.Contains(im.env[0], "=") {
						out, err = e.run(ctx, img, []string{"-e", "NVIDIA_VISIBLE_DEVICES=1"}, probeArgs(r.major, r.gpus)...)
						if err != nil {
							t.Fatal(err)
						}
						checkIsolation(t, out, r.gpus, Expect{GPUs: []int{1}, Control: true, Volume: true})
					}
					if got := owners(t, r.state); len(got) != 0 {
						t.Errorf("owners %v after the containers ended", got)
					}
				})
			}
		})
	}
}

// TestImageCompatFiles: images whose /usr/local/cuda/compat holds a FIFO or
// a character device by the compat library's name, or is a link to a host
// folder holding one, run on the driver's own libcuda: nothing is opened on
// the host, the FIFO blocks nothing (the container runs, and a create and
// a delete on the same state directory after it take at most 2 s each), and
// the runtime logs what it ignored. An image holding a real compat library
// gets it first in LD_LIBRARY_PATH, which shows the check is made.
func TestImageCompatFiles(t *testing.T) {
	r := newAttackRig(t)
	probe, err := os.ReadFile(testenv.BuildProbe(t))
	if err != nil {
		t.Fatal(err)
	}
	// An ELF without the compat note, of a branch newer than any driver:
	// used wherever it is read.
	const lib = "usr/local/cuda/compat/libcuda.so.999.0.0"
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "libcuda.so.999.0.0"), probe, 0o644); err != nil {
		t.Fatal(err)
	}
	images := []struct {
		name    string
		entries []imageEntry
		compat  bool   // compat first in LD_LIBRARY_PATH
		logged  string // in the runtime's log
	}{
		{name: "fifo", entries: append(dirs(lib), imageEntry{hdr: tar.Header{Name: lib, Typeflag: tar.TypeFifo}}), logged: "a FIFO: not a regular file"},
		{name: "char device", entries: append(dirs(lib), imageEntry{hdr: tar.Header{Name: lib, Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}}), logged: "a character device: not a regular file"},
		{name: "link to a host folder", entries: append(dirs("usr/local/cuda/x"), imageEntry{hdr: tar.Header{Name: "usr/local/cuda/compat", Typeflag: tar.TypeSymlink, Linkname: host}})},
		{name: "real library", entries: append(dirs(lib), imageEntry{hdr: tar.Header{Name: lib, Typeflag: tar.TypeReg}, body: probe}), compat: true},
	}
	tars := map[string]string{}
	for _, im := range images {
		tars[im.name] = imageTar(t, im.entries...)
	}
	global := []string{"--simulate", "dgx1-volta", "--dev-root", r.sim, "--state-dir", r.state, "--accept-env-request", "always"}
	probeBin := testenv.BuildProbe(t)
	for name, mk := range r.engines(t) {
		t.Run(name, func(t *testing.T) {
			e := mk(t)
			for _, im := range images {
				t.Run(im.name, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
					defer cancel()
					img := e.image(ctx, t, tars[im.name])
					// Past the runtime's default deadline, a create that hangs
					// is a failure, not a wait.
					rctx, rcancel := context.WithTimeout(ctx, 90*time.Second)
					out, err := e.run(rctx, img, []string{"-e", "NVIDIA_VISIBLE_DEVICES=0"}, "do", "env", "LD_LIBRARY_PATH")
					rcancel()
					if err != nil {
						t.Errorf("run: %v\n%s", err, out)
					}
					if got := strings.Contains(out, "LD_LIBRARY_PATH=/usr/local/cuda/compat:"); got != im.compat {
						t.Errorf("compat first in LD_LIBRARY_PATH: %v, want %v\n%s", got, im.compat, out)
					}
					if log := e.log(); log != "" && im.logged != "" && !strings.Contains(log, im.logged) {
						t.Errorf("the runtime's log does not say %q:\n%s", im.logged, log)
					}
					// Nothing holds the state directory: a create and a
					// delete of another container succeed. Were its lock
					// still held, each would give up at --timeout with
					// "deadline exceeded".
					id := fmt.Sprintf("gpuiso-after-%d", time.Now().UnixNano())
					root := t.TempDir()
					forgetContainer(t, id, root)
					rt := func(args ...string) {
						t.Helper()
						out, err := runtimeOut(t, r.bin, append(append(slices.Clone(global), "--root", root, "--timeout", "10s"), args...)...)
						if err != nil {
							t.Errorf("%s: %v\n%s", args[0], err, out)
						}
					}
					rt("create", "--bundle", sleepBundle(t, probeBin, "5"), id)
					rt("delete", "--force", id)
				})
			}
		})
	}
}

// TestAllClaimsNothing: with a state directory, "all" shows a container the
// GPUs no container holds and claims none of them: a later container still
// gets one of them, and the GPU held before stays out of its view.
func TestAllClaimsNothing(t *testing.T) {
	r := newAttackRig(t)
	testenv.RequireRunc(t)
	probe := testenv.BuildProbe(t)
	root := t.TempDir()
	rt := func(args ...string) (string, error) {
		return runtimeOut(t, r.bin, append([]string{"--simulate", "dgx1-volta", "--dev-root", r.sim, "--state-dir", r.state,
			"--root", root, "--accept-env-request", "always"}, args...)...)
	}
	holder, all, later := "gpuiso-hold-2", "gpuiso-all", "gpuiso-later-3"
	for _, id := range []string{holder, all, later} {
		forgetContainer(t, id, root)
	}
	if out, err := rt("create", "--bundle", sleepBundle(t, probe, "2"), holder); err != nil {
		t.Fatalf("create %s: %v\n%s", holder, err, out)
	}
	bundle := sleepBundle(t, probe, "all")
	setProcessArgs(t, bundle, "/probe", "do", "ls", "/dev", "--", "env", "NVIDIA_VISIBLE_DEVICES", "--", "sleep", "600")
	// The container's standard output is runc create's: a file of ours.
	outFile := filepath.Join(t.TempDir(), "out")
	f, err := os.Create(outFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(r.bin, "--simulate", "dgx1-volta", "--dev-root", r.sim, "--state-dir", r.state,
		"--root", root, "--accept-env-request", "always", "create", "--bundle", bundle, all)
	cmd.Stdout, cmd.Stderr = f, f
	err = cmd.Run()
	f.Close()
	if err != nil {
		b, _ := os.ReadFile(outFile)
		t.Fatalf("create %s: %v\n%s", all, err, b)
	}
	if got := owners(t, r.state); len(got) != 1 || !slices.Equal(heldBy(got, holder), []int{2}) {
		t.Errorf("owners %v, want only %s holding GPU 2", got, holder)
	}
	if out, err := rt("create", "--bundle", sleepBundle(t, probe, "3"), later); err != nil {
		t.Errorf("create of GPU 3 beside %s: %v\n%s", all, err, out)
	}
	if out, err := exec.Command("runc", "--root", root, "start", all).CombinedOutput(); err != nil {
		t.Fatalf("start: %v: %s", err, out)
	}
	out := waitOutput(t, outFile, "NVIDIA_VISIBLE_DEVICES=")
	var nodes []string
	for l := range strings.Lines(out) {
		if l = strings.TrimSpace(l); isGPUNode(l) {
			nodes = append(nodes, l)
		}
	}
	slices.Sort(nodes)
	if want := []string{"nvidia0", "nvidia1", "nvidia3", "nvidia4", "nvidia5", "nvidia6", "nvidia7"}; !slices.Equal(nodes, want) {
		t.Errorf("%s sees %q, want %q (every GPU but the one held)\n%s", all, nodes, want, out)
	}
	for _, id := range []string{later, all, holder} {
		if out, err := rt("delete", "--force", id); err != nil {
			t.Errorf("delete %s: %v\n%s", id, err, out)
		}
	}
}

// setProcessArgs sets the process args of bundle's config.json.
func setProcessArgs(t *testing.T, bundle string, args ...string) {
	t.Helper()
	cfg := filepath.Join(bundle, "config.json")
	raw, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	spec["process"].(map[string]any)["args"] = args
	if raw, err = json.Marshal(spec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitOutput waits for the file path to hold want, and returns it.
func waitOutput(t *testing.T, path, want string) string {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), want) {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not hold %q after 30 s:\n%s", path, want, b)
		}
	}
}

// TestDeviceOfOwnedGPU: a spec whose device list holds the node of a GPU
// another container owns (docker run --device) is refused in one line
// naming the owner, and nothing is created; a free GPU's node passes.
func TestDeviceOfOwnedGPU(t *testing.T) {
	r := newAttackRig(t)
	testenv.RequireRunc(t)
	probe := testenv.BuildProbe(t)
	root := t.TempDir()
	rt := func(args ...string) (string, error) {
		return runtimeOut(t, r.bin, append([]string{"--simulate", "dgx1-volta", "--dev-root", r.sim, "--state-dir", r.state,
			"--root", root, "--accept-env-request", "always"}, args...)...)
	}
	holder, thief, free := "gpuiso-dev-hold", "gpuiso-dev-thief", "gpuiso-dev-free"
	for _, id := range []string{holder, thief, free} {
		forgetContainer(t, id, root)
	}
	if out, err := rt("create", "--bundle", sleepBundle(t, probe, "4"), holder); err != nil {
		t.Fatalf("create %s: %v\n%s", holder, err, out)
	}
	withDevice := func(minor int) string {
		b := sleepBundle(t, probe, "void")
		cfg := filepath.Join(b, "config.json")
		raw, err := os.ReadFile(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var spec map[string]any
		if err := json.Unmarshal(raw, &spec); err != nil {
			t.Fatal(err)
		}
		linux := spec["linux"].(map[string]any)
		linux["devices"] = []any{map[string]any{"path": "/dev/nvidia-x", "type": "c", "major": r.major, "minor": minor}}
		if raw, err = json.Marshal(spec); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cfg, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		return b
	}
	out, err := rt("create", "--bundle", withDevice(4), thief)
	if err == nil || strings.Count(out, "\n") != 1 || !strings.Contains(out, "owned by "+holder) || !strings.Contains(out, "device held by another container") {
		t.Errorf("create with GPU 4's node while %s owns it: %v\n%s", holder, err, out)
	}
	if _, err := exec.Command("runc", "--root", root, "state", thief).CombinedOutput(); err == nil {
		t.Errorf("runc has the refused container %s", thief)
	}
	if out, err := rt("create", "--bundle", withDevice(5), free); err != nil {
		t.Errorf("create with free GPU 5's node: %v\n%s", err, out)
	}
	for _, id := range []string{free, holder} {
		rt("delete", "--force", id)
	}
}

// TestLockDeadline: while another process holds the state directory's
// lock, a create gives up at its --timeout, in one line naming the holder,
// and creates nothing.
func TestLockDeadline(t *testing.T) {
	r := newAttackRig(t)
	n, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	host := &simnode.Host{Root: r.sim, DevRoot: r.sim + "/dev", ProcRoot: r.sim + "/proc", SysRoot: r.sim + "/sys"}
	inv, err := nvmlnode.Discover(context.Background(), n.DiscoverOptions(host)...)
	if err != nil {
		t.Fatal(err)
	}
	a, err := allocator.New(inv, allocator.WithStateDir(r.state))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	held, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- a.Exclusive(context.Background(), func() error { close(held); <-release; return nil })
	}()
	<-held
	runc, calls := fakeRunc(t)
	bundle := sleepBundle(t, testenv.BuildProbe(t), "3")
	// The lock stays held until the create has exited: a create that
	// waited for it past --timeout, or waited for it again to give back
	// what it began, would be killed at this guard instead.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.bin, "--simulate", "dgx1-volta", "--dev-root", r.sim, "--state-dir", r.state, "--runc", runc,
		"--accept-env-request", "always", "--timeout", "1s", "create", "--bundle", bundle, "gpuiso-locked")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(stderr).ReadString('\n')
	took := time.Since(start)
	rest, _ := io.ReadAll(stderr)
	err = cmd.Wait()
	exited := time.Since(start)
	hung := ctx.Err()
	close(release)
	if err := <-done; err != nil {
		t.Error(err)
	}
	if hung != nil {
		t.Fatalf("the create did not exit while the lock was held; killed after %v: %v\n%s%s", exited, hung, line, rest)
	}
	want := fmt.Sprintf("held by pid %d (", os.Getpid())
	if err == nil || len(rest) != 0 || !strings.HasPrefix(line, "gpuiso-runtime: ") || !strings.Contains(line, want) || !strings.Contains(line, "deadline exceeded") {
		t.Errorf("create with the lock held: %v\n%s%s\nwant one line with %q", err, line, rest, want)
	}
	t.Logf("refused after %v, exited after %v: %s", took.Round(time.Millisecond), exited.Round(time.Millisecond), strings.TrimSpace(line))
	if _, err := os.Stat(calls); err == nil {
		t.Error("runc was called")
	}
}
