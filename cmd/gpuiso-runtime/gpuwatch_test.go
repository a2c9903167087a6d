package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/conformance"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// gpuWatch is the conformance suite's sampler over the containers of runc
// roots while a test runs: no GPU may be allowed to two live containers at
// once, and the allocator of the state directory must hold every GPU a
// live container's device cgroup allows, for the container's owner.
type gpuWatch struct {
	smp   *conformance.Sampler
	ended bool
}

// watchEvery is the time between two samples: a runc list of each root
// and a read of each container's device cgroup.
const watchEvery = 100 * time.Millisecond

// watchGPUs starts sampling the containers of roots (runc roots) that keep
// accepts (nil: all), for the allocator of state on the simulated node of
// the tree sim (dgx1-volta). The sampling ends, and its failures fail t,
// at end or when t ends.
func watchGPUs(t *testing.T, sim, state string, roots []string, keep func(id string) bool) *gpuWatch {
	t.Helper()
	n, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	host := &simnode.Host{Root: sim, DevRoot: sim + "/dev", ProcRoot: sim + "/proc", SysRoot: sim + "/sys"}
	inv, err := nvmlnode.Discover(context.Background(), n.DiscoverOptions(host)...)
	if err != nil {
		t.Fatal(err)
	}
	minorOf := map[string]int{}
	var minors []int
	var major uint32
	for _, d := range inv.Devices {
		minorOf[d.UUID] = int(d.Node.Minor)
		minors = append(minors, int(d.Node.Minor))
		major = d.Node.Major
	}
	w := &gpuWatch{smp: conformance.NewSampler(conformance.Watch{
		Live:  func() ([]conformance.Container, error) { return runcLive(roots, keep) },
		Held:  conformance.HeldIn(state, minorOf),
		GPUs:  conformance.GPUsAllowed(major, minors),
		Every: watchEvery,
	})}
	w.smp.Start()
	t.Cleanup(func() { w.end(t) })
	return w
}

// end stops the sampling and fails t for each of its failures (once each,
// with the number of samples that saw it).
func (w *gpuWatch) end(t *testing.T) {
	t.Helper()
	if w.ended {
		return
	}
	w.ended = true
	seen := map[string]int{}
	var order []string
	for _, f := range w.smp.Finish() {
		if seen[f] == 0 {
			order = append(order, f)
		}
		seen[f]++
	}
	for _, f := range order {
		t.Errorf("sampler (%d samples): %s", seen[f], f)
	}
}

// expectSeen fails t unless the sampler saw at least n containers running
// with a device cgroup: the watch watched something.
func (w *gpuWatch) expectSeen(t *testing.T, n int) {
	t.Helper()
	w.smp.Sample()
	if got := w.smp.SeenRunning(); got < n {
		t.Errorf("the sampler saw %d containers running, want at least %d", got, n)
	}
}

// runcLive lists the containers of roots that keep accepts and whose init
// runs (created or running), each named by its owner (id and root, as
// gpuiso-runtime names it in the allocator).
func runcLive(roots []string, keep func(id string) bool) ([]conformance.Container, error) {
	var out []conformance.Container
	for _, root := range roots {
		if _, err := os.Stat(root); errors.Is(err, os.ErrNotExist) {
			continue
		}
		var list []struct {
			ID     string `json:"id"`
			Pid    int    `json:"pid"`
			Status string `json:"status"`
		}
		// A container being created or deleted meanwhile can make one
		// listing fail; three in a row cannot.
		var err error
		for range 3 {
			var b []byte
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			b, err = exec.CommandContext(ctx, "runc", "--root", root, "list", "--format", "json").Output()
			cancel()
			if err == nil {
				err = json.Unmarshal(b, &list)
			}
			if err == nil {
				break
			}
		}
		if err != nil {
			return nil, fmt.Errorf("runc list in %s: %w", root, err)
		}
		for _, c := range list {
			if c.Status == "stopped" || c.Pid <= 0 || (keep != nil && !keep(c.ID)) {
				continue
			}
			owner, err := ownerOf(c.ID, resolvePath(root))
			if err != nil {
				return nil, err
			}
			out = append(out, conformance.Container{ID: owner, Proc: conformance.ProcOf(c.Pid)})
		}
	}
	return out, nil
}

// watch samples the containers of r's runc root and of roots until t ends
// (see watchGPUs).
func (r *rig) watch(t *testing.T, roots ...string) *gpuWatch {
	t.Helper()
	return watchGPUs(t, r.sim, r.state, append([]string{r.root}, roots...), nil)
}
