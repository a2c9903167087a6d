package native_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/containerizer/rootfs"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/volume"
)

// dockerDefaultCapEff is CapEff of a root process under Docker's default
// capabilities.
const dockerDefaultCapEff = "00000000a80425fb"

// escapeResults maps each probe of `probe escape` to its result.
type escapeResults struct {
	order []string
	res   map[string]string
}

func parseEscape(t *testing.T, out string) escapeResults {
	t.Helper()
	r := escapeResults{res: map[string]string{}}
	for l := range strings.Lines(out) {
		k, v, ok := strings.Cut(strings.TrimSpace(l), " ")
		if !ok {
			continue
		}
		r.order = append(r.order, k)
		r.res[k] = strings.TrimSpace(v)
	}
	if len(r.order) < 15 {
		t.Fatalf("the escape probe answered %d lines:\n%s", len(r.order), out)
	}
	return r
}

// checkRefused fails t for every probe that got through.
func checkRefused(t *testing.T, who string, r escapeResults) {
	t.Helper()
	for _, k := range r.order {
		v := r.res[k]
		switch k {
		case "CapBnd", "CapEff":
			if v != dockerDefaultCapEff {
				t.Errorf("%s: %s %s, want Docker's %s", who, k, v, dockerDefaultCapEff)
			}
		case "NoNewPrivs": // Docker sets it only when asked
			if who != "docker" && v != "1" {
				t.Errorf("%s: no_new_privs %s", who, v)
			}
		case "Seccomp":
			if v != "2" {
				t.Errorf("%s: seccomp mode %s, want 2 (filter)", who, v)
			}
		case "pids-visible":
			if n := len(strings.Split(v, ",")); n > 2 {
				t.Errorf("%s: sees %d processes (%s): not its own pid namespace", who, n, v)
			}
		case "open-fds":
			// Checked by the caller, which knows the descriptor it left open.
		default:
			if v == "ok" || strings.HasPrefix(v, "ok:") {
				t.Errorf("%s: %s got through (%s)", who, k, v)
			}
		}
	}
}

// TestEscape runs the escape probes as root in a native container, on
// cgroup v1 and v2, and the same probes in a Docker container as the
// reference; every one must be refused. It logs the table of errnos.
func TestEscape(t *testing.T) {
	columns := map[string]escapeResults{}
	var names []string
	var victim struct {
		gpu, other string
	}
	type column struct {
		v    cgroups.Version
		root string // "": the host's view; "rootfs": a directory; "image": an unpacked OCI image
	}
	host := hostBait(t)
	for _, col := range []column{{cgroups.V1, ""}, {cgroups.V2, ""}, {cgroups.V1, "rootfs"}, {cgroups.V2, "rootfs"}, {cgroups.V1, "image"}, {cgroups.V2, "image"}} {
		v, name := col.v, "native/"+col.v.String()
		if col.root != "" {
			name += "+" + col.root
		}
		t.Run(name, func(t *testing.T) {
			n := newNode(t, v)
			var root, probe = "", n.probe
			// Without a root file system of its own the container sees the
			// host's, read-only, and no volume; with one, the volume.
			hostFile := fmt.Sprintf("/gpuiso-escape-%d", os.Getpid())
			where := append(host.args(), "hostfile="+hostFile, "workdir=1")
			workdir := t.TempDir()
			var labels map[string]string
			switch col.root {
			case "rootfs":
				root, probe, workdir = rootFS(t, n.probe), "/probe", ""
				where = append(host.args(), "volume=/usr/local/nvidia")
			case "image":
				root, labels = unpackedImage(t, n.probe), map[string]string{volume.LabelVolumesNeeded: "nvidia_driver"}
				probe, workdir = "/probe", ""
				where = append(host.args(), "volume=/usr/local/nvidia")
			}
			t.Cleanup(func() {
				if _, err := os.Stat(hostFile); err == nil {
					os.Remove(hostFile)
					t.Errorf("the container created %s on the host", hostFile)
				}
			})
			ctx := context.Background()
			// The victim: another container holding GPU 0.
			if _, err := n.c.Launch(ctx, containerizer.Spec{ID: "victim", Command: []string{n.probe, "sleep", "60"}, GPUs: allocator.Request{Devices: []string{"0"}}}); err != nil {
				t.Fatal(err)
			}
			minor := n.inv.Devices[0].Minor
			gpu := fmt.Sprintf("%d:%d", n.inv.Devices[0].Node.Major, n.inv.Devices[0].Node.Minor)
			other := filepath.Join(n.dirs.State, "victim", "dev", fmt.Sprintf("nvidia%d", minor))
			var out bytes.Buffer
			_, err := n.c.Launch(ctx, containerizer.Spec{ID: "attacker", GPUs: allocator.Request{Devices: []string{"1"}}, RootFS: root, Labels: labels, Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}, Dir: workdir,
				// The walk for sockets leaves out the test runs' temporary
				// directories: they hold the daemons other packages' tests
				// run meanwhile, where a real host's would be in /tmp.
				Command: append([]string{probe, "escape", "gpu=" + gpu, "other=" + other, fmt.Sprintf("hostpid=%d", os.Getpid()), "skip=" + testenv.RunsDir()}, where...),
				Stdout:  &out, Stderr: &out})
			if err != nil {
				t.Fatal(err)
			}
			if st, err := n.c.Wait(ctx, "attacker"); err != nil || st.Code != 0 {
				t.Fatalf("attacker: exit %d, %v\n%s", st.Code, err, out.String())
			}
			r := parseEscape(t, out.String())
			checkRefused(t, name, r)
			host.check(t, name, r, workdir)
			columns[name] = r
			names = append(names, name)
			victim.gpu, victim.other = gpu, other
		})
	}
	t.Run("docker", func(t *testing.T) {
		testenv.RequireRoot(t)
		cli := testenv.RequireDocker(t)
		testenv.LockDocker(t, false)
		n := newNode(t, hostVersion())
		img := testenv.BuildProbeImage(t, cli, testenv.ProbeImage{Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"}})
		ns := fmt.Sprintf("test-escape-%d", time.Now().UnixNano())
		dz, err := docker.New(cli, n.alloc, docker.WithVolumes(n.vols), docker.WithNamespace(ns), docker.WithStopTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if _, err := n.c.Launch(ctx, containerizer.Spec{ID: "victim", Command: []string{n.probe, "sleep", "60"}, GPUs: allocator.Request{Devices: []string{"0"}}}); err != nil {
			t.Fatal(err)
		}
		minor := n.inv.Devices[0].Minor
		var out bytes.Buffer
		_, err = dz.Launch(ctx, containerizer.Spec{ID: "attacker", Image: img, GPUs: allocator.Request{Devices: []string{"1"}},
			Command: []string{"escape", "volume=/usr/local/nvidia", fmt.Sprintf("gpu=%d:%d", n.inv.Devices[0].Node.Major, n.inv.Devices[0].Node.Minor), "other=" + filepath.Join(n.dirs.State, "victim", "dev", fmt.Sprintf("nvidia%d", minor)), fmt.Sprintf("hostpid=%d", os.Getpid())},
			Stdout:  &out, Stderr: &out})
		if err != nil {
			t.Fatal(err)
		}
		defer dz.Destroy(context.WithoutCancel(ctx), "attacker")
		if st, err := dz.Wait(ctx, "attacker"); err != nil || st.Code != 0 {
			t.Fatalf("attacker: exit %d, %v\n%s", st.Code, err, out.String())
		}
		r := parseEscape(t, out.String())
		checkRefused(t, "docker", r)
		columns["docker"] = r
		names = append(names, "docker")
	})
	if len(names) == 0 {
		return
	}
	var tab strings.Builder
	w := tabwriter.NewWriter(&tab, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "probe\t%s\n", strings.Join(names, "\t"))
	for _, k := range columns[names[0]].order {
		row := []string{k}
		for _, c := range names {
			row = append(row, columns[c].res[k])
		}
		fmt.Fprintln(w, strings.Join(row, "\t"))
	}
	w.Flush()
	t.Logf("escape probes (victim GPU %s, its node %s):\n%s", victim.gpu, victim.other, tab.String())
}

// TestConfinementOptions runs a container as another user and one with a
// capability added back.
func TestConfinementOptions(t *testing.T) {
	n := newNode(t, hostVersion())
	for _, tc := range []struct {
		name string
		spec containerizer.Spec
		want []string
	}{
		{name: "default", want: []string{"CapEff:\t" + dockerDefaultCapEff, "Uid:\t0\t0\t0\t0", "NoNewPrivs:\t1", "Seccomp:\t2"}},
		{name: "user", spec: containerizer.Spec{User: &containerizer.User{UID: 1000, GID: 1001}},
			want: []string{"CapEff:\t0000000000000000", "Uid:\t1000\t1000\t1000\t1000", "Gid:\t1001\t1001\t1001\t1001", "Groups:\t "}},
		{name: "cap-add", spec: containerizer.Spec{CapAdd: []string{"SYS_PTRACE"}}, want: []string{"CapEff:\t00000000a80c25fb"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			spec.ID, spec.Command = "opts-"+tc.name, []string{"/bin/cat", "/proc/self/status"}
			spec.GPUs = allocator.Request{Count: 1}
			var out bytes.Buffer
			spec.Stdout, spec.Stderr = &out, &out
			ctx := context.Background()
			if _, err := n.c.Launch(ctx, spec); err != nil {
				t.Fatal(err)
			}
			defer n.c.Destroy(ctx, spec.ID)
			if st, err := n.c.Wait(ctx, spec.ID); err != nil || st.Code != 0 {
				t.Fatalf("exit %d, %v\n%s", st.Code, err, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w+"\n") {
					t.Errorf("no %q in /proc/self/status:\n%s", w, out.String())
				}
			}
		})
	}
	if _, err := n.c.Launch(context.Background(), containerizer.Spec{ID: "bad-cap", Command: []string{"/bin/true"}, GPUs: allocator.Request{Count: 1}, CapAdd: []string{"SYS_NOPE"}}); err == nil {
		t.Fatal("an unknown capability was accepted")
	}
	if len(native.DefaultCapabilities()) != 14 {
		t.Fatalf("DefaultCapabilities() = %v", native.DefaultCapabilities())
	}
}

// bait is what the host offers an attacker in a native container: its
// daemons' sockets, a listener on its loopback, an abstract socket, a
// directory left open without close-on-exec, and its /tmp.
type bait struct {
	sockets  []string
	tcp      string
	abstract string
	fd       int
	fdDir    string
	plant    string
}

// hostBait sets the bait up for the whole test: real daemon sockets where
// the host has them, and one of the test's own in /run.
func hostBait(t *testing.T) *bait {
	t.Helper()
	testenv.RequireRoot(t)
	b := &bait{plant: fmt.Sprintf("gpuiso-escape-plant-%d", os.Getpid())}
	own := fmt.Sprintf("/run/gpuiso-escape-%d.sock", os.Getpid())
	for _, spec := range []struct{ network, addr string }{{"unix", own}, {"tcp", "127.0.0.1:0"}, {"unix", fmt.Sprintf("@gpuiso-escape-%d", os.Getpid())}} {
		l := testenv.Listen(t, spec.network, spec.addr)
		switch {
		case spec.network == "tcp":
			b.tcp = l.Addr().String()
		case strings.HasPrefix(spec.addr, "@"):
			b.abstract = spec.addr[1:]
		}
	}
	b.sockets = []string{own}
	for _, p := range []string{"/run/docker.sock", "/run/containerd/containerd.sock", "/run/podman/podman.sock"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode()&os.ModeSocket != 0 {
			b.sockets = append(b.sockets, p)
		}
	}
	b.fdDir = t.TempDir()
	fd, err := syscall.Open(b.fdDir, syscall.O_RDONLY|syscall.O_DIRECTORY, 0) // no O_CLOEXEC: as a careless caller leaves it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	b.fd = fd
	t.Cleanup(func() {
		for _, p := range []string{filepath.Join("/tmp", b.plant), filepath.Join("/tmp", b.plant+"-null")} {
			os.Remove(p)
		}
	})
	return b
}

func (b *bait) args() []string {
	return []string{"sockets=" + strings.Join(b.sockets, ","), "tcp=" + b.tcp, "abstract=" + b.abstract, fmt.Sprintf("fd=%d", b.fd), "plant=" + b.plant}
}

// check looks from the host at what the attacker left: nothing in the
// host's /tmp or the directory it held open; the descriptor not among its
// open ones. The working directory is shared: what was planted there is
// there, but neither setuid nor device files work in it (checked inside).
func (b *bait) check(t *testing.T, who string, r escapeResults, workdir string) {
	t.Helper()
	for _, p := range []string{filepath.Join("/tmp", b.plant), filepath.Join("/tmp", b.plant+"-null"), filepath.Join(b.fdDir, "gpuiso-escape-fd")} {
		if _, err := os.Lstat(p); err == nil {
			os.Remove(p)
			t.Errorf("%s: the container wrote %s on the host", who, p)
		}
	}
	if slices.Contains(strings.Split(r.res["open-fds"], ","), strconv.Itoa(b.fd)) {
		t.Errorf("%s: the container holds the caller's fd %d (open: %s)", who, b.fd, r.res["open-fds"])
	}
	if workdir != "" {
		if _, err := os.Stat(filepath.Join(workdir, b.plant)); err != nil {
			t.Errorf("%s: the shared working directory does not hold what the container wrote: %v", who, err)
		}
	}
}

// TestExtraFiles hands a container one descriptor on purpose: it arrives as
// fd 3 and works, while a descriptor the caller merely left open does not
// arrive at all.
func TestExtraFiles(t *testing.T) {
	n := newNode(t, hostVersion())
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	leaked, err := syscall.Open(t.TempDir(), syscall.O_RDONLY|syscall.O_DIRECTORY, 0) // no close-on-exec
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(leaked)
	var out bytes.Buffer
	ctx := context.Background()
	_, err = n.c.Launch(ctx, containerizer.Spec{ID: "extra", Command: []string{"/bin/sh", "-c", "echo through-fd-3 >&3; ls /proc/self/fd | tr '\\n' ' '"},
		GPUs: allocator.Request{Count: 1}, ExtraFiles: []*os.File{w}, Stdout: &out, Stderr: &out})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer n.c.Destroy(ctx, "extra")
	if st, err := n.c.Wait(ctx, "extra"); err != nil || st.Code != 0 {
		t.Fatalf("exit %d, %v\n%s", st.Code, err, out.String())
	}
	got, err := io.ReadAll(r)
	if err != nil || string(got) != "through-fd-3\n" {
		t.Errorf("fd 3 carried %q, %v", got, err)
	}
	if fds := strings.Fields(out.String()); !slices.Equal(fds, []string{"0", "1", "2", "3", "4"}) {
		t.Errorf("the command holds fds %v, want 0-3 and ls's own (the caller's fd %d must not arrive)", fds, leaked)
	}
}

// unpackedImage unpacks an OCI image holding the probe, as gpurun --image
// does, and returns its root.
func unpackedImage(t *testing.T, probe string) string {
	t.Helper()
	b, err := os.ReadFile(probe)
	if err != nil {
		t.Fatal(err)
	}
	layout := testenv.OCILayout(t, ocispec.ImageConfig{Entrypoint: []string{"/probe"}}, []testenv.LayerEntry{{Name: "probe", Body: b, Mode: 0o755}})
	root := filepath.Join(t.TempDir(), "rootfs")
	if _, err := rootfs.Unpack(context.Background(), layout, root); err != nil {
		t.Fatal(err)
	}
	return root
}
