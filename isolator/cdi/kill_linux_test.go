package cdi_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/node"
)

// killChildEnv makes the test binary a spec writer that writes into the
// directory it names until it is killed (see killWriter).
const killChildEnv = "GPUISO_CDI_KILL_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(killChildEnv); dir != "" {
		os.Exit(killWriter(dir))
	}
	os.Exit(m.Run())
}

// killOwners are the owners whose allocation specs the killed writers
// write, beside the node's spec.
var killOwners = []string{"c1", "c2", "c3"}

// killSpecs are the specs a killed writer writes, by file name: two node
// specs (the node with two GPUs and with one) and three allocation specs
// per owner (one GPU, the other, both). Every file of the spec directory
// must hold one of them, byte for byte, whenever a writer dies.
type killSpecs struct {
	node   []*specs.Spec
	alloc  map[string][]*specs.Spec
	byFile map[string][]string // file name -> encoded specs
}

func newKillSpecs() (*killSpecs, error) {
	inv := &node.Inventory{
		Devices: []node.Device{
			{Index: 0, Minor: 0, UUID: "GPU-00000000-0000-0000-0000-000000000000", Node: node.DeviceNode{Path: "/dev/nvidia0", Major: 195, Minor: 0}, Health: node.Healthy()},
			{Index: 1, Minor: 1, UUID: "GPU-11111111-1111-1111-1111-111111111111", Node: node.DeviceNode{Path: "/dev/nvidia1", Major: 195, Minor: 1}, Health: node.Healthy()},
		},
		ControlDevices: []node.ControlDevice{{Name: node.NVIDIACtl, Path: "/dev/nvidiactl", Major: 195, Minor: 255}},
	}
	one := inv.Clone()
	one.Devices = one.Devices[:1]
	ks := &killSpecs{alloc: map[string][]*specs.Spec{}, byFile: map[string][]string{}}
	w := cdi.Writer{Dir: "/"} // for file names only
	add := func(path string, s *specs.Spec) error {
		b, err := cdi.Encode(s)
		if err != nil {
			return err
		}
		ks.byFile[filepath.Base(path)] = append(ks.byFile[filepath.Base(path)], string(b))
		return nil
	}
	path, err := w.Path(cdi.DefaultKind)
	if err != nil {
		return nil, err
	}
	for _, in := range []*node.Inventory{inv, one} {
		s, err := cdi.New(in)
		if err != nil {
			return nil, err
		}
		ks.node = append(ks.node, s)
		if err := add(path, s); err != nil {
			return nil, err
		}
	}
	all := []node.DeviceRef{inv.Devices[0].Ref(), inv.Devices[1].Ref()}
	for _, owner := range killOwners {
		path, err := w.AllocationPath(cdi.DefaultKind, owner)
		if err != nil {
			return nil, err
		}
		for _, gpus := range [][]node.DeviceRef{all[:1], all[1:], all} {
			plan, err := isolator.NewPlan(owner, inv, gpus, nil, nil)
			if err != nil {
				return nil, err
			}
			s, err := cdi.Render(cdi.DefaultKind, plan)
			if err != nil {
				return nil, err
			}
			ks.alloc[owner] = append(ks.alloc[owner], s)
			if err := add(path, s); err != nil {
				return nil, err
			}
		}
	}
	return ks, nil
}

// killWriter writes the specs of killSpecs into dir, each write one that
// changes its file, and prints a line after each, until it is killed. Its
// seed and whether it syncs come from the environment.
func killWriter(dir string) int {
	ks, err := newKillSpecs()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	seed, _ := strconv.ParseUint(os.Getenv(killChildEnv+"_SEED"), 10, 64)
	rng := rand.New(rand.NewPCG(seed, seed))
	w := cdi.Writer{Dir: dir, NoSync: os.Getenv(killChildEnv+"_NOSYNC") == "1"}
	ctx := context.Background()
	last := map[int]int{}
	out := bufio.NewWriter(os.Stdout)
	for i := 0; ; i++ {
		target := rng.IntN(1 + len(killOwners))
		n := len(ks.node)
		if target > 0 {
			n = len(ks.alloc[killOwners[target-1]])
		}
		v, ok := last[target]
		if ok {
			v = (v + 1 + rng.IntN(n-1)) % n // another one: the write changes the file
		} else {
			v = rng.IntN(n)
		}
		last[target] = v
		var res cdi.Result
		if target == 0 {
			res, err = w.Write(ctx, ks.node[v])
		} else {
			owner := killOwners[target-1]
			res, err = w.WriteAllocation(ctx, owner, ks.alloc[owner][v])
		}
		if err == nil && ok && !res.Changed {
			// The file held something else than last time: another
			// writer's, which this one does not expect.
			err = fmt.Errorf("write %d of %s changed nothing", i, res.Path)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Fprintln(out, i)
		out.Flush()
	}
}

// TestKilledWriter: writers SIGKILLed at sampled moments, most of them
// while a write's temporary file is in the spec directory, others
// anywhere (before it, after the rename, before the directory's sync),
// never leave a half-written spec: every file of the directory is one
// of the specs written, whole and valid; and what they leave behind is
// gone after a new writer's Sweep, or after its next write that changes a
// file, whichever comes first.
func TestKilledWriter(t *testing.T) {
	ks, err := newKillSpecs()
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("GPUISO_CDI_KILL_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (GPUISO_CDI_KILL_SEED=%d repeats this run)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	dir := t.TempDir()
	rounds := 60
	if testing.Short() {
		rounds = 20
	}
	inside := 0
	for round := range rounds {
		noSync := round%2 == 1
		wantInside := rng.IntN(4) != 0
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), killChildEnv+"="+dir,
			fmt.Sprintf("%s_SEED=%d", killChildEnv, rng.Uint64()))
		if noSync {
			cmd.Env = append(cmd.Env, killChildEnv+"_NOSYNC=1")
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waited := false
		t.Cleanup(func() { // a round that failed before its kill
			if !waited {
				cmd.Process.Kill()
				cmd.Wait()
			}
		})
		lines := make(chan struct{}, 1<<16)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				select {
				case lines <- struct{}{}:
				default:
				}
			}
			close(lines)
		}()
		written := func() bool {
			_, ok := <-lines
			return ok
		}
		for range 1 + rng.IntN(4) {
			if !written() {
				cmd.Wait()
				t.Fatalf("round %d: the writer ended: %s", round, stderr.String())
			}
		}
		pid := cmd.Process.Pid
		temp := ""
		for attempt := 0; ; attempt++ {
			// Sampled moment, not a synchronisation: the writer runs
			// on until the stop lands wherever it is.
			time.Sleep(time.Duration(rng.IntN(1500)) * time.Microsecond)
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			var ws syscall.WaitStatus
			if _, err := syscall.Wait4(pid, &ws, syscall.WUNTRACED, nil); err != nil {
				t.Fatal(err)
			}
			if !ws.Stopped() {
				t.Fatalf("round %d: the writer ended: %v: %s", round, ws, stderr.String())
			}
			temp = tempFile(t, dir)
			if temp != "" || !wantInside || attempt == 2000 {
				break
			}
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if !written() {
				cmd.Wait()
				t.Fatalf("round %d: the writer ended: %s", round, stderr.String())
			}
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cmd.Wait() // reaped: its temporary file names a dead writer now
		waited = true
		if temp != "" {
			inside++
		}
		where := "outside a temporary file's life"
		if temp != "" {
			where = "with " + temp + " in the directory"
		}

		// The rename is the only way a spec reaches its file.
		checkSpecs(t, ks, dir, fmt.Sprintf("round %d, killed %s", round, where))

		w := cdi.Writer{Dir: dir}
		if round%2 == 0 {
			if err := w.Sweep(t.Context()); err != nil {
				t.Fatalf("round %d: Sweep: %v", round, err)
			}
			if left := tempFile(t, dir); left != "" {
				t.Fatalf("round %d, killed %s: after Sweep the directory holds %s", round, where, left)
			}
		}
		// The next write that changes a file: the node spec it does not
		// hold now.
		v := 0
		if b, err := os.ReadFile(filepath.Join(dir, "nvidia.com-gpu.json")); err == nil {
			if enc, _ := cdi.Encode(ks.node[0]); string(b) == string(enc) {
				v = 1
			}
		}
		if res, err := w.Write(t.Context(), ks.node[v]); err != nil || !res.Changed {
			t.Fatalf("round %d: write after the kill: %+v, %v", round, res, err)
		}
		if left := tempFile(t, dir); left != "" {
			t.Fatalf("round %d, killed %s: after a new writer's write the directory holds %s", round, where, left)
		}
		if err := w.Sweep(t.Context()); err != nil {
			t.Fatalf("round %d: Sweep: %v", round, err)
		}
		checkSpecs(t, ks, dir, fmt.Sprintf("round %d, after the next write", round))
	}
	t.Logf("%d of %d writers killed while their temporary file was in the directory", inside, rounds)
	if inside == 0 {
		t.Fatalf("no writer of %d was killed inside a write: the run says nothing about what such a kill leaves", rounds)
	}
}

// tempFile is a file of dir that is not a spec file ("" if none).
func tempFile(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			return e.Name()
		}
	}
	return ""
}

// checkSpecs: every spec file of dir is valid and holds, byte for byte,
// one of the specs written to it.
func checkSpecs(t *testing.T, ks *killSpecs, dir, when string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if _, err := cdi.ValidateFile(path); err != nil {
			t.Fatalf("%s: %s: %v", when, e.Name(), err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(ks.byFile[e.Name()], string(b)) {
			t.Fatalf("%s: %s holds %d bytes that no writer wrote to it", when, e.Name(), len(b))
		}
	}
}
