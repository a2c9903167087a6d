package dra_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
)

// TestPrepareConcurrent: claims prepared and unprepared at once (the
// kubelet's calls are not serialised), each twice at the same time, end
// as one at a time would: every claim its own GPU and the same answer to
// both calls, then nothing held and no checkpoint or CDI spec left; a
// claim of a GPU another owner holds fails among them and is rolled back.
func TestPrepareConcurrent(t *testing.T) {
	e := newEnv(t, "dgx1-volta")
	d, a := e.driver(t)
	var names []string
	for _, dev := range dra.Devices(e.inv, a.Devices(), dra.SliceOptions{}) {
		names = append(names, dev.Name)
	}
	ctx := t.Context()
	// The last GPU is another owner's: claim "x" of it fails.
	taken := names[len(names)-1]
	names = names[:len(names)-1]
	n := len(names)
	if _, err := a.Allocate(ctx, "other", allocator.Request{Devices: []string{e.inv.Devices[len(e.inv.Devices)-1].UUID}}); err != nil {
		t.Fatal(err)
	}
	var xerr error
	answers := make([][]string, 2*n)
	errs := make([]error, 2*n)
	var wg sync.WaitGroup
	wg.Go(func() { _, xerr = d.Prepare(ctx, claim("x", taken)) })
	for i := range 2 * n {
		wg.Go(func() {
			devs, err := d.Prepare(ctx, claim(fmt.Sprint("c", i%n), names[i%n]))
			errs[i] = err
			for _, dv := range devs {
				answers[i] = append(answers[i], dv.CDIDeviceIDs...)
			}
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || errs[i+n] != nil {
			t.Fatalf("claim c%d: %v, %v", i, errs[i], errs[i+n])
		}
		if len(answers[i]) != 1 || !slices.Equal(answers[i], answers[i+n]) {
			t.Errorf("claim c%d: answers %v and %v", i, answers[i], answers[i+n])
		}
	}
	if xerr == nil {
		t.Error("claim x of a GPU another owner holds was prepared")
	}
	held := map[string]string{}
	for _, al := range a.Allocations() {
		if al.Owner == "other" {
			continue
		}
		for _, ref := range al.Devices {
			if o, ok := held[ref.UUID]; ok {
				t.Errorf("GPU %s held by %s and %s", ref.UUID, o, al.Owner)
			}
			held[ref.UUID] = al.Owner
		}
	}
	if len(held) != n {
		t.Errorf("%d GPUs held, want %d", len(held), n)
	}
	for i := range 2 * n {
		wg.Go(func() { errs[i] = d.Unprepare(ctx, fmt.Sprint("c", i%n)) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("unprepare c%d: %v", i%n, err)
		}
	}
	if als := a.Allocations(); len(als) != 1 || als[0].Owner != "other" {
		t.Errorf("held after unprepare: %v", als)
	}
	for _, dir := range []string{e.stateDir, e.cdiDir} {
		left, _ := filepath.Glob(filepath.Join(dir, "*"))
		for _, f := range left {
			if fi, err := os.Stat(f); err == nil && !fi.IsDir() {
				t.Errorf("left: %s", f)
			}
		}
	}
}
