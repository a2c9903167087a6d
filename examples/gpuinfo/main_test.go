package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/simnode"
)

var update = flag.Bool("update", false, "rewrite the expected outputs under testdata/")

func gpuinfo(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return out.String(), errOut.String(), code
}

// TestSimulatedOutput compares the printed inventory of every shipped
// topology with the expected text under testdata/.
func TestSimulatedOutput(t *testing.T) {
	for _, name := range []string{"dgx1-volta", "dgx-a100", "rtx8000x4", "hgx-h100-mig"} {
		t.Run(name, func(t *testing.T) {
			out, errOut, code := gpuinfo(t, "--simulate", name, "--driver-version", "535.104.05", "--dev-root", t.TempDir())
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			golden := filepath.Join("testdata", name+".txt")
			if *update {
				if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if out != string(want) {
				t.Fatalf("output differs from %s (go test -update rewrites it):\n%s", golden, out)
			}
		})
	}
}

func TestNVSwitchMatrix(t *testing.T) {
	out, _, _ := gpuinfo(t, "--simulate", "dgx-a100", "--dev-root", t.TempDir())
	rows := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) != 10 || !strings.HasPrefix(f[0], "GPU") || f[1] == "UUID" {
			continue
		}
		rows++
		for j, c := range f[1:9] {
			want := "NV12"
			if f[0] == fmt.Sprintf("GPU%d", j) {
				want = "X"
			}
			if c != want {
				t.Fatalf("row %s column %d = %s, want %s", f[0], j, c, want)
			}
		}
	}
	if rows != 8 {
		t.Fatalf("found %d matrix rows, want 8:\n%s", rows, out)
	}
}

func TestJSON(t *testing.T) {
	out, errOut, code := gpuinfo(t, "--simulate", "hgx-h100", "--json", "--dev-root", t.TempDir())
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var inv node.Inventory
	if err := json.Unmarshal([]byte(out), &inv); err != nil {
		t.Fatalf("output is not an inventory: %v\n%s", err, out)
	}
	if len(inv.Devices) != 8 || inv.Topology.Link(0, 7).NVLinks != 18 || inv.CUDAVersion == 0 {
		t.Fatalf("inventory = %+v", inv)
	}
}

func TestUsageErrors(t *testing.T) {
	for name, args := range map[string][]string{
		"unknown topology":             {"--simulate", "dgx-z9"},
		"stray argument":               {"now"},
		"version without simulation":   {"--driver-version", "535.1"},
		"library and simulation":       {"--simulate", "pcie8", "--nvml-library", "/x.so"},
		"relative dev root":            {"--simulate", "pcie8", "--dev-root", "dev"},
		"unknown flag":                 {"--gpus", "2"},
		"bad simulated driver version": {"--simulate", "pcie8", "--driver-version", "../x"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, errOut, code := gpuinfo(t, args...); code == 0 || strings.Count(errOut, "\n") != 1 {
				t.Fatalf("gpuinfo %q: exit %d, stderr %q; want an error in one line", args, code, errOut)
			}
		})
	}
}

// TestLibraryMissing: NVML loaded from a path with no library gives one line
// naming the cause and the way out, exit 1.
func TestLibraryMissing(t *testing.T) {
	out, errOut, code := gpuinfo(t, "--nvml-library", filepath.Join(t.TempDir(), "libnvidia-ml.so.1"))
	assertOneLine(t, out, errOut, code, "NVML library libnvidia-ml.so.1 not found")
}

// TestNotNVMLLibrary: a file that is not an NVML library (text, a program,
// a library without nvmlInit_v2) is refused in one line before it is loaded.
func TestNotNVMLLibrary(t *testing.T) {
	text := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	if err := os.WriteFile(text, []byte("not a library\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{"text": text, "program": exe}
	if libc, err := filepath.Glob("/lib/x86_64-linux-gnu/libc.so.6"); err == nil && len(libc) == 1 {
		cases["other library"] = libc[0]
	}
	for name, path := range cases {
		t.Run(name, func(t *testing.T) {
			out, errOut, code := gpuinfo(t, "--nvml-library", path)
			if code != 125 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "not an NVML library") {
				t.Fatalf("exit %d, stdout %q, stderr %q: want 125 and one line saying it is not an NVML library", code, out, errOut)
			}
		})
	}
}

// TestDriverNotLoaded runs against the host's real NVIDIA libraries, which
// have no kernel driver to talk to on the test hosts.
func TestDriverNotLoaded(t *testing.T) {
	testenv.RequireNVIDIALibraries(t)
	if _, err := os.Stat("/proc/driver/nvidia/version"); err == nil {
		t.Skip("the NVIDIA kernel driver is loaded here")
	}
	out, errOut, code := gpuinfo(t)
	assertOneLine(t, out, errOut, code, "NVIDIA kernel driver not loaded")
}

// TestLibrariesRemoved runs the built command with the host's NVIDIA library
// directory hidden under an empty tmpfs, in a private mount namespace: what
// a node without the driver package sees.
func TestLibrariesRemoved(t *testing.T) {
	lib := testenv.RequireNVIDIALibraries(t)
	testenv.RequireRoot(t)
	real, err := filepath.EvalSymlinks(lib)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "gpuinfo")
	if b, err := exec.Command("go", "build", "-buildvcs=false", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, b)
	}
	script := `mount -t tmpfs none "$1" && exec "$2"`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", filepath.Dir(real), bin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	assertOneLine(t, out.String(), errOut.String(), code, "NVML library libnvidia-ml.so.1 not found")
}

func assertOneLine(t *testing.T, out, errOut string, code int, want string) {
	t.Helper()
	if code != 125 || out != "" {
		t.Fatalf("exit %d, stdout %q: want exit 125 and nothing on stdout", code, out)
	}
	lines := strings.Split(strings.TrimRight(errOut, "\n"), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], want) || !strings.Contains(lines[0], "--simulate") {
		t.Fatalf("stderr = %q: want one line saying %q and suggesting --simulate", errOut, want)
	}
}

// TestSimulatedHostNumbers: as root, a simulated node is shown with the
// device numbers its containers get (the simulated host tree's, not the real
// host's 195:255), every control node including nvidia-uvm, a UUID column,
// the MIG mode, and the MIG devices' capability nodes.
func TestSimulatedHostNumbers(t *testing.T) {
	testenv.RequireRoot(t)
	out, errOut, code := gpuinfo(t, "--simulate", "hgx-h100-mig")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !regexp.MustCompile(`(?m)^GPU\s+UUID\s+MINOR\s.*\sMIG\s+HEALTH$`).MatchString(out) {
		t.Errorf("no GPU table header with UUID and MIG columns in\n%s", out)
	}
	for _, want := range []string{"Enabled", "Disabled", " GPU-", " MIG-", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	caps := regexp.MustCompile(`(?m)^\s+\d+\s+\d+\s+\S+\s.*MIG-\S+\s+(\S+), (\S+)$`)
	m := caps.FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		t.Fatalf("no MIG device row with capability nodes in\n%s", out)
	}
	ctl := regexp.MustCompile(`(?m)^\s+nvidiactl\s+(\d+):255\s`).FindStringSubmatch(out)
	if ctl == nil || ctl[1] == "195" {
		t.Fatalf("nvidiactl shown as %v, want the simulated node's major (not 195):\n%s", ctl, out)
	}
}

// TestHealthTable: the health table, as printed, says what each signal
// gives.
func TestHealthTable(t *testing.T) {
	out, errOut, code := gpuinfo(t, "--health-table")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{`(?m)^xid 94 +inform +restart-app `, `(?m)^xid 109 +unhealthy +reset-gpu `, `(?m)^recovery-action 2 +unhealthy +reboot `, `(?m)^lost +unhealthy +reset-gpu `} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("no line %s in\n%s", want, out)
		}
	}
	if _, _, code := gpuinfo(t, "--health-table", "--json"); code != 125 {
		t.Errorf("--health-table with another flag: exit %d", code)
	}
}

// TestInjectUsage: --inject is refused, with exit 125 and nothing
// written, without a simulated host tree, a GPU or a signal that reads.
func TestInjectUsage(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "host")
	for _, args := range [][]string{
		{"--inject", "xid 79", "--gpu", "3"},
		{"--simulate", "dgx1-volta", "--inject", "xid 79", "--gpu", "3"},
		{"--simulate", "dgx1-volta", "--sim-root", dir, "--inject", "xid 79"},
		{"--simulate", "dgx1-volta", "--sim-root", dir, "--inject", "xid", "--gpu", "3"},
		{"--simulate", "dgx1-volta", "--sim-root", dir, "--inject", "meltdown", "--gpu", "3"},
		{"--simulate", "dgx1-volta", "--sim-root", dir, "--inject", "xid 79", "--gpu", "8"},
		{"--simulate", "dgx1-volta", "--sim-root", dir, "--inject", "xid 79", "--gpu", "1", "--mig", "1-0"},
		{"--simulate", "dgx1-volta", "--sim-root", dir, "--inject", "reset maybe", "--gpu", "3"},
		{"--simulate", "dgx1-volta", "--sim-root", dir, "--inject", "reset fail", "--gpu", "3", "--mig", "1/0"},
		{"--simulate", "dgx1-volta", "--sim-root", dir, "--gpu", "3"},
	} {
		if _, errOut, code := gpuinfo(t, args...); code != 125 || !strings.HasPrefix(errOut, "gpuinfo: ") {
			t.Errorf("%q: exit %d, %q", args, code, errOut)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a refused --inject wrote %s: %v", dir, err)
	}
}

// TestInject: a fault injected into a simulated host tree is seen by the
// next program over that tree (GPU 3 unhealthy, fallen off the bus), and
// clear heals it.
func TestInject(t *testing.T) {
	testenv.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "host")
	sim := []string{"--simulate", "dgx1-volta", "--sim-root", dir}
	health := func() node.Health {
		t.Helper()
		out, errOut, code := gpuinfo(t, append(sim, "--json")...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var inv node.Inventory
		if err := json.Unmarshal([]byte(out), &inv); err != nil {
			t.Fatal(err)
		}
		return inv.Devices[3].Health
	}
	if h := health(); !h.Healthy {
		t.Fatalf("GPU 3 before: %s", h)
	}
	out, errOut, code := gpuinfo(t, append(sim, "--inject", "xid 79", "--gpu", "3")...)
	if code != 0 || !strings.Contains(out, "injected xid 79 into GPU 3") || !strings.Contains(out, "unhealthy, reset-gpu") {
		t.Fatalf("exit %d: %s%s", code, out, errOut)
	}
	if h := health(); h.Healthy {
		t.Fatal("GPU 3 healthy after xid 79")
	}
	if _, errOut, code := gpuinfo(t, append(sim, "--inject", "clear", "--gpu", "3")...); code != 0 {
		t.Fatalf("clear: exit %d: %s", code, errOut)
	}
	if h := health(); !h.Healthy {
		t.Fatalf("GPU 3 after clear: %s", h)
	}
	// The reset mode set in the tree is what a node over it resets by.
	reset := func() error {
		t.Helper()
		n, err := simnode.New("dgx1-volta")
		if err != nil {
			t.Fatal(err)
		}
		h, err := n.OpenHost(t.Context(), dir)
		if err == nil {
			err = n.ShareFaults(h)
		}
		if err != nil {
			t.Fatal(err)
		}
		return n.ResetGPU(t.Context(), node.Device{Index: 3, UUID: n.UUID(3)})
	}
	for _, tt := range []struct {
		mode, says string
		fails      bool
	}{{"reset fail", "now fail", true}, {"reset ok", "now succeed", false}} {
		out, errOut, code := gpuinfo(t, append(sim, "--inject", tt.mode, "--gpu", "3")...)
		if code != 0 || !strings.Contains(out, tt.says) {
			t.Fatalf("%s: exit %d: %s%s", tt.mode, code, out, errOut)
		}
		if err := reset(); errors.Is(err, node.ErrResetFailed) != tt.fails {
			t.Errorf("after %s: reset %v", tt.mode, err)
		}
	}
}
