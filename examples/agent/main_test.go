package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	cgroupsv3 "github.com/containerd/cgroups/v3"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer/chain"
	"github.com/gpuiso/gpuiso/internal/cli"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
)

// asAgentEnv makes the test binary the agent (its main), as the test
// bundle's bin/agent runs it where there is no go command.
const asAgentEnv = "GPUISO_TEST_AS_AGENT"

func TestMain(m *testing.M) {
	if os.Getenv(asAgentEnv) == "1" {
		// The agent's children are not agents: its stub (this binary
		// again) is told apart by stubEnv, its commands (a prober) by
		// their own variables.
		os.Unsetenv(asAgentEnv)
		main()
	}
	if os.Getenv(stubEnv) == "1" {
		main() // the stub of an agent run from this binary
	}
	testenv.Main(m)
}

// buildAgent returns the agent program: a prebuilt one (a test bundle's),
// or one compiled into a directory of t.
func buildAgent(t *testing.T) string {
	t.Helper()
	return testenv.Program(t, testenv.Root, "agent", "github.com/gpuiso/gpuiso/examples/agent")
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string // on stdout (help) or stderr
	}{
		{"help", []string{"--help"}, 0, "usage: agent"},
		{"unknown flag", []string{"--nope"}, cli.ExitError, "flag provided but not defined: --nope"},
		{"negative gpus", []string{"--gpus", "-1", "--", "true"}, cli.ExitError, "--gpus -1"},
		{"gpus without a command", []string{"--gpus", "2"}, cli.ExitError, "need a command"},
		{"empty state dir", []string{"--state-dir", "", "--", "true"}, cli.ExitError, "--state-dir is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tc.args, nil, &stdout, &stderr)
			got := stderr.String()
			if tc.code == 0 {
				got = stdout.String()
				if stderr.Len() != 0 {
					t.Errorf("stderr %q, want nothing", stderr.String())
				}
			}
			if code != tc.code || !strings.Contains(got, tc.out) {
				t.Errorf("exit %d, output %q: want %d and %q", code, got, tc.code, tc.out)
			}
		})
	}
}

// lines forwards each line of r to a channel.
func lines(r io.Reader) <-chan string {
	ch := make(chan string, 64)
	go func() {
		defer close(ch)
		s := bufio.NewScanner(r)
		for s.Scan() {
			ch <- s.Text()
		}
	}()
	return ch
}

// waitFor returns the first line with prefix, failing when the output ends
// without one.
func waitFor(t *testing.T, ch <-chan string, prefix string) string {
	t.Helper()
	var seen []string
	for l := range ch {
		if strings.HasPrefix(l, prefix) {
			return l
		}
		seen = append(seen, l)
	}
	t.Fatalf("output ended without a line %q: %q", prefix, seen)
	return ""
}

// TestRecoverAfterKill kills the agent with SIGKILL while its container
// runs and starts it again: the container's GPU stays held and allowed to
// it, another GPU stays denied, and when the container exits the restarted
// agent releases everything: allocation, cgroups, records.
func TestRecoverAfterKill(t *testing.T) {
	requireCgroups(t)
	bin := buildAgent(t)
	state := filepath.Join(t.TempDir(), "state")
	ctx := context.Background()

	// The container is a prober: it opens device nodes on request, from
	// inside its cgroups, through pipes that outlive the agent.
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer inW.Close()
	defer outR.Close()
	probeArgs, probeEnv := testenv.ProberCommand(t)
	first := exec.Command(bin, append([]string{"--simulate", "dgx1-volta", "--gpus", "1", "--state-dir", state, "--"}, probeArgs...)...)
	first.Env = append(os.Environ(), probeEnv)
	first.Stdin, first.Stdout = inR, outW
	firstErr, err := first.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	inR.Close()
	outW.Close()
	t.Cleanup(func() { first.Process.Kill(); first.Wait() })
	started := waitFor(t, lines(firstErr), "agent: container ")
	id := strings.TrimSuffix(strings.Fields(started)[2], ":")
	prober := testenv.NewProber(inW, outR)

	// What the container holds, and the node paths of its GPU and another.
	nd, err := cli.OpenSharedNode(ctx, "dgx1-volta", filepath.Join(state, "sim", "dgx1-volta"))
	if err != nil {
		t.Fatal(err)
	}
	defer nd.Close()
	held := func() []string {
		t.Helper()
		a, err := allocator.New(nd.Inventory, allocator.WithStateDir(filepath.Join(state, "alloc")))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		var uuids []string
		for _, al := range a.Allocations() {
			for _, d := range al.Devices {
				uuids = append(uuids, al.Owner+" "+d.UUID)
			}
		}
		return uuids
	}
	owned := held()
	if len(owned) != 1 || !strings.HasPrefix(owned[0], id+" ") {
		t.Fatalf("allocations %v, want one GPU of %s", owned, id)
	}
	var mine, other string
	for _, d := range nd.Inventory.Devices {
		if id+" "+d.UUID == owned[0] {
			mine = d.Node.Path
		} else if other == "" {
			other = d.Node.Path
		}
	}
	check := func(when string) {
		t.Helper()
		got, err := prober.OpenAll(mine, other)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if !testenv.Allowed(got[mine]) || got[other] != "EPERM" {
			t.Errorf("%s: its GPU %s: %s, another %s: %s; want allowed and EPERM", when, mine, got[mine], other, got[other])
		}
	}
	check("before the kill")

	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.Wait()
	check("with the agent dead")

	second := exec.Command(bin, "--simulate", "dgx1-volta", "--state-dir", state)
	secondErr, err := second.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Process.Kill(); second.Wait() })
	waitFor(t, lines(secondErr), "agent: recovered container "+id)
	if got := held(); len(got) != 1 || got[0] != owned[0] {
		t.Errorf("after recovery: allocations %v, want %v", got, owned)
	}
	check("after recovery")

	// The container exits (its prober reads the end of its input); the
	// restarted agent cleans up after it and exits 0.
	inW.Close()
	if err := second.Wait(); err != nil {
		t.Fatalf("restarted agent: %v", err)
	}
	if got := held(); len(got) != 0 {
		t.Errorf("allocations left: %v", got)
	}
	for _, dir := range []string{filepath.Join(state, "containers"), filepath.Join(state, "gpu")} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Name() != ".lock" { // the GPU isolator's, kept for the next start
				t.Errorf("left in %s: %s", dir, e.Name())
			}
		}
	}
	noCgroups(t, state, id)
}

// TestTerminate: SIGTERM ends the agent and its container (exit 143) and
// leaves nothing: allocation, records, cgroups.
func TestTerminate(t *testing.T) {
	requireCgroups(t)
	bin := buildAgent(t)
	state := filepath.Join(t.TempDir(), "state")
	cmd := exec.Command(bin, "--simulate", "dgx1-volta", "--gpus", "2", "--state-dir", state, "--", "sleep", "600")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	out := lines(stderr)
	id := strings.TrimSuffix(strings.Fields(waitFor(t, out, "agent: container "))[2], ":")
	// A second agent on the same state directory is refused while the
	// first runs, and touches nothing of it.
	second, err := exec.Command(bin, "--simulate", "dgx1-volta", "--state-dir", state).CombinedOutput()
	if code := exitCode(err); code != cli.ExitError || !strings.Contains(string(second), "in use") {
		t.Errorf("second agent: exit %d, %q; want 125 and the directory in use", code, second)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for range out {
	}
	var ee *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 143 {
		t.Fatalf("agent after SIGTERM: %v, want exit 143", err)
	}
	entries, err := os.ReadDir(filepath.Join(state, "containers"))
	if err != nil || len(entries) != 0 {
		t.Errorf("records left: %v (%v)", entries, err)
	}
	b, err := os.ReadFile(filepath.Join(state, "alloc", allocator.StateFile))
	if err != nil || strings.Contains(string(b), id) {
		t.Errorf("allocator state still names %s (%v):\n%s", id, err, b)
	}
	noCgroups(t, state, id)
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// requireCgroups skips t unless it runs as root with the cgroups the agent
// uses: v1's devices controller (with cpu and memory), or cgroup2 alone.
func requireCgroups(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t)
	if cgroupsv3.Mode() == cgroupsv3.Unified {
		testenv.RequireCgroupV2(t)
	} else {
		testenv.RequireCgroupV1Devices(t)
	}
}

// noCgroups fails t if any cgroup of container id of the agent whose
// state directory is state is left.
func noCgroups(t *testing.T, state, id string) {
	t.Helper()
	dirs := []string{"/sys/fs/cgroup/gpuiso-agent/" + id}
	if cgroupsv3.Mode() != cgroupsv3.Unified {
		dirs = []string{
			"/sys/fs/cgroup/cpu/gpuiso-agent/" + id,
			"/sys/fs/cgroup/memory/gpuiso-agent/" + id,
			filepath.Join(cgroups.DefaultV1Mount, chain.CgroupParent(filepath.Join(state, "gpu"))),
		}
	}
	for _, dir := range dirs {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s left (%v)", dir, err)
		}
	}
}

// TestKilledAnywhere kills the agent with SIGKILL at points spread over its
// launch (before the record, between cgroups, between isolation and the
// command's start, while it runs); one more start then recovers or removes
// whatever each left, waits for the containers that still run, and leaves
// nothing: no record, allocation or cgroup. Where each kill lands varies
// from run to run; what must hold does not.
func TestKilledAnywhere(t *testing.T) {
	requireCgroups(t)
	bin := buildAgent(t)
	state := filepath.Join(t.TempDir(), "state")
	const kills = 12
	var ids []string
	for i := range kills {
		// A node of 16 GPUs: the containers that kills leave running hold
		// theirs until they end, fewer than 16 at any time.
		cmd := exec.Command(bin, "--simulate", "dgx2", "--gpus", "1", "--state-dir", state, "--", "sleep", "1")
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		out := lines(stderr)
		if i%3 == 2 {
			// While the container runs.
			l := waitFor(t, out, "agent: container ")
			ids = append(ids, strings.TrimSuffix(strings.Fields(l)[2], ":"))
		} else {
			// Somewhere in start-up or launch.
			time.Sleep(time.Duration(i) * 7 * time.Millisecond)
		}
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		for range out {
		}
	}
	// Every cgroup the agent makes has a record first: the records left
	// name every container a kill may have left.
	recs, err := os.ReadDir(filepath.Join(state, "containers"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range recs {
		if id, ok := strings.CutSuffix(e.Name(), ".json"); ok && !strings.HasPrefix(id, ".") {
			ids = append(ids, id)
		}
	}
	t.Logf("%d kills left %d records", kills, len(recs))
	last := exec.Command(bin, "--simulate", "dgx2", "--state-dir", state)
	if out, err := last.CombinedOutput(); err != nil {
		t.Fatalf("start after %d kills: %v\n%s", kills, err, out)
	}
	for _, dir := range []string{filepath.Join(state, "containers"), filepath.Join(state, "gpu")} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Name() != ".lock" {
				t.Errorf("left in %s: %s", dir, e.Name())
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(state, "alloc", allocator.StateFile))
	if err != nil || strings.Contains(string(b), "ct-") {
		t.Errorf("allocations left (%v):\n%s", err, b)
	}
	for _, id := range ids {
		noCgroups(t, state, id)
	}
}
