package vmtest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// vmBudget bounds the whole VM step (bundle, boot, suites) against a hang;
// the suites are chosen to take well under it on a 2-core host (see run.sh
// --vm), about half of it on a host that runs nothing else.
const vmBudget = 25 * time.Minute

// ArgsEnv names the environment variable whose words are added to run.sh's
// arguments in the VM (for instance -test.run=TestCPUAffinity, to run one
// test of every suite while working on it); GPUISO_SUITES (which suites)
// and GPUISO_CONFORMANCE_* reach the guest as they are, and
// GPUISO_VM_VERBOSE=1 runs the suites with -test.v.
const ArgsEnv = "GPUISO_VM_ARGS"

// passed are the host's variables the guest gets.
var passed = []string{"GPUISO_SUITES", "GPUISO_CONFORMANCE_SEED", "GPUISO_CONFORMANCE_KILLS"}

// TestCgroup2VM is the cgroup2-only VM step of the full test command: on a
// host that is not cgroup2-only (this hybrid one: v1 controllers, a cgroup2
// with none), it builds the cgroup2 suites' test binaries (internal/testing/hwtest's
// bundle.sh --vm), boots Debian's kernel under qemu with cgroup_no_v1=all,
// two NUMA nodes and the host's /usr shared read-only, and runs them there as
// root (run.sh --vm): the native containerizer, the chain, the agent,
// gpurun, gpuiso-runtime under runc and the conformance suite on the
// unified hierarchy alone, and the CPU pinning against a real second NUMA
// node. It fails unless every suite passes, and logs how long each part
// took.
func TestCgroup2VM(t *testing.T) {
	began := time.Now()
	var missing []string
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		missing = append(missing, fmt.Sprintf("qemu-system-x86_64: %v", err))
	}
	k, err := FindKernel(DefaultKernelDir)
	if err != nil {
		missing = append(missing, err.Error())
	}
	for _, tool := range []string{"go", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, fmt.Sprintf("%s: %v", tool, err))
		}
	}
	src, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err == nil {
		if _, err = os.Stat(filepath.Join(src, "internal", "testing", "hwtest", "bundle.sh")); err != nil {
			missing = append(missing, fmt.Sprintf("the source tree: %v", err))
		}
	}
	testenv.RequireCgroupV2VM(t, missing...)

	dir := t.TempDir()
	bundle := filepath.Join(dir, "bundle")
	build := exec.Command("bash", filepath.Join(src, "internal", "testing", "hwtest", "bundle.sh"), "--vm", bundle)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("bundle.sh --vm: %v\n%s", err, out)
	}
	built := time.Since(began)

	args := "--vm --src /src"
	if os.Getenv("GPUISO_VM_VERBOSE") != "1" {
		args += " --quiet"
	}
	if extra := os.Getenv(ArgsEnv); extra != "" {
		args += " " + extra
	}
	var env []string
	for _, k := range passed {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	g := Guest{
		Usr:  GuestUsr(),
		Hide: GuestHidden(),
		Shares: []GuestShare{
			{Share: Share{Tag: "bundle", Path: bundle, ReadOnly: true}, Dir: "/bundle"},
			{Share: Share{Tag: "src", Path: src, ReadOnly: true}, Dir: "/src"},
		},
		Path:    []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"},
		Dir:     "/",
		Env:     env,
		Command: "bash /bundle/run.sh " + args,
	}
	a, skipped, err := Initramfs(k, "/etc", g)
	if err != nil {
		t.Fatal(err)
	}
	if len(skipped) > 0 {
		t.Logf("left out of the guest's /etc: %s", strings.Join(skipped, ", "))
	}
	initrd := filepath.Join(dir, "initramfs.cpio")
	f, err := os.Create(initrd)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteTo(f); err != nil {
		f.Close()
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	m := Machine{
		QEMU: qemu, Kernel: k.Vmlinux(), Initrd: initrd, Cmdline: Cmdline(),
		CPUs: 2, NUMANodes: 2, MemoryMiB: 3072,
		Shares: g.MachineShares(), KernelLog: filepath.Join(dir, "kernel.log"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), vmBudget-time.Since(began))
	defer cancel()
	var up, end time.Duration
	exit, pass := -1, false
	booted := time.Now()
	err = m.Run(ctx, func(l string) {
		t.Log(l)
		switch {
		case strings.HasPrefix(l, "vmtest: up "):
			up = time.Since(booted)
		case strings.HasPrefix(l, "vmtest: exit "):
			end = time.Since(booted)
			fmt.Sscanf(l, "vmtest: exit %d", &exit)
		case l == "hwtest: PASS in the cgroup2-only VM":
			pass = true
		}
	})
	if err != nil || exit != 0 || !pass {
		b, _ := os.ReadFile(m.KernelLog)
		t.Logf("the kernel's log, last lines:\n%s", tail(b, 40))
		t.Fatalf("the cgroup2-only VM: %v, run.sh exit %d, PASS line seen %v", err, exit, pass)
	}
	t.Logf("cgroup2-only VM step: %s in all (bundle %s, boot to the suites %s, suites %s, power-off %s)",
		time.Since(began).Round(time.Second), built.Round(time.Second), up.Round(time.Second),
		(end - up).Round(time.Second), (time.Since(booted) - end).Round(time.Second))
}

// tail returns the last n lines of b.
func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// readArchive parses a newc archive as the kernel does: names, modes, data.
func readArchive(t *testing.T, b []byte) map[string]entry {
	t.Helper()
	out := map[string]entry{}
	r := bufio.NewReader(bytes.NewReader(b))
	off := 0
	read := func(n int) []byte {
		buf := make([]byte, n)
		if _, err := io.ReadFull(r, buf); err != nil {
			t.Fatalf("archive ends at %d: %v", off, err)
		}
		off += n
		return buf
	}
	pad := func() {
		if off%4 != 0 {
			read(4 - off%4)
		}
	}
	for {
		h := string(read(110))
		if h[:6] != "070701" {
			t.Fatalf("bad magic %q at %d", h[:6], off-110)
		}
		field := func(i int) uint32 {
			var v uint32
			fmt.Sscanf(h[6+8*i:14+8*i], "%08X", &v)
			return v
		}
		mode, size, major, minor, namesize := field(1), field(6), field(9), field(10), field(11)
		name := string(read(int(namesize)))
		name = strings.TrimSuffix(name, "\x00")
		pad()
		data := read(int(size))
		pad()
		if name == "TRAILER!!!" {
			return out
		}
		out[name] = entry{name: name, mode: mode, data: data, major: major, minor: minor}
	}
}
