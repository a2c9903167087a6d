package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// scrape returns the samples of the handler's /metrics, "name{labels}"
// to value, and the content type it answered with.
func scrape(t *testing.T, h http.Handler) (map[string]string, string) {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s, %v\n%s", resp.Status, err, b)
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		out[l[:i]] = l[i+1:]
	}
	return out, resp.Header.Get("Content-Type")
}

// TestMetricsHandler: /metrics shows the node's GPUs and MIG devices by
// health, the devices held, each GPU's shares and memory held (a GPU held
// whole, a memory share, a MIG device), the claims prepared, the DRA
// driver's operations by result and their latency histograms, and the
// process's collectors; /healthz answers.
func TestMetricsHandler(t *testing.T) {
	ctx := context.Background()
	sim, err := simnode.New("hgx-h100-mig")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := nvmlnode.Discover(ctx, append(sim.DiscoverOptions(nil),
		nvmlnode.WithDevRoot(t.TempDir()), nvmlnode.WithProcRoot(t.TempDir()), nvmlnode.WithSysRoot(t.TempDir()))...)
	if err != nil {
		t.Fatal(err)
	}
	var whole, shared, migGPU node.Device
	var wholes int
	for _, d := range inv.Devices {
		switch {
		case d.MIGSplit() && migGPU.UUID == "":
			migGPU = d
		case !d.MIGSplit() && whole.UUID == "":
			whole, wholes = d, wholes+1
		case !d.MIGSplit() && shared.UUID == "":
			shared, wholes = d, wholes+1
		case !d.MIGSplit():
			wholes++
		}
	}
	if migGPU.UUID == "" || shared.UUID == "" {
		t.Fatal("hgx-h100-mig: want a GPU split by MIG and two whole ones")
	}
	alloc, err := allocator.New(inv, allocator.WithStateDir(t.TempDir()), allocator.WithShared(shared.UUID))
	if err != nil {
		t.Fatal(err)
	}
	defer alloc.Close()
	mig := migGPU.MIGDevices[0]
	for owner, r := range map[string]allocator.Request{
		"whole": {Devices: []string{whole.UUID}},
		"share": {Devices: []string{shared.UUID}, Share: &allocator.Share{Mode: allocator.ShareMemory, MemoryBytes: 8 << 30}},
		"mig":   {Devices: []string{mig.UUID}},
	} {
		if _, err := alloc.Allocate(ctx, owner, r); err != nil {
			t.Fatalf("%s: %v", owner, err)
		}
	}
	lost := inv.Devices[len(inv.Devices)-1]
	if _, err := alloc.MarkUnhealthy(ctx, lost.UUID, "lost"); err != nil {
		t.Fatal(err)
	}

	ops := newDRAMetrics()
	ops.Observe(dra.Event{Op: dra.OpPrepare, Took: 3 * time.Millisecond, Steps: []dra.Step{{Name: dra.StepWait}, {Name: dra.StepAllocate, Took: time.Millisecond}}})
	ops.Observe(dra.Event{Op: dra.OpPrepare, Took: 2 * time.Second, Err: errors.New("no")})
	ops.Observe(dra.Event{Op: dra.OpUnprepare, Took: time.Millisecond})
	reg, err := metricsRegistry(alloc, func() int { return 2 }, ops)
	if err != nil {
		t.Fatal(err)
	}
	got, ctype := scrape(t, metricsHandler(reg))
	if !strings.HasPrefix(ctype, "text/plain") {
		t.Errorf("content type %q", ctype)
	}
	migs := 0
	for _, d := range inv.Devices {
		migs += len(d.MIGDevices)
	}
	gpu := func(d node.Device) string { return `{gpu="` + d.UUID + `",index="` + strconv.Itoa(d.Index) + `"}` }
	want := map[string]string{
		`gpuiso_gpus{health="healthy"}`:                                                           strconv.Itoa(len(inv.Devices) - 1),
		`gpuiso_gpus{health="unhealthy"}`:                                                         "1",
		`gpuiso_mig_devices{health="healthy"}`:                                                    strconv.Itoa(migs),
		`gpuiso_mig_devices{health="unhealthy"}`:                                                  "0",
		`gpuiso_devices_held`:                                                                     "3",
		`gpuiso_claims_prepared`:                                                                  "2",
		`gpuiso_gpu_shares` + gpu(shared):                                                         "1",
		`gpuiso_gpu_shares` + gpu(whole):                                                          "0",
		`gpuiso_gpu_memory_held_bytes` + gpu(shared):                                              strconv.Itoa(8 << 30),
		`gpuiso_gpu_memory_held_bytes` + gpu(whole):                                               strconv.FormatUint(whole.MemoryBytes, 10),
		`gpuiso_gpu_memory_held_bytes` + gpu(migGPU):                                              strconv.FormatUint(mig.MemoryBytes, 10),
		`gpuiso_gpu_memory_held_bytes` + gpu(lost):                                                "0",
		`gpuiso_gpu_memory_bytes` + gpu(whole):                                                    strconv.FormatUint(whole.MemoryBytes, 10),
		`gpuiso_dra_operations_total{op="prepare",result="success"}`:                              "1",
		`gpuiso_dra_operations_total{op="prepare",result="error"}`:                                "1",
		`gpuiso_dra_operations_total{op="unprepare",result="success"}`:                            "1",
		`gpuiso_dra_operation_duration_seconds_count{op="prepare"}`:                               "2",
		`gpuiso_dra_operation_duration_seconds_bucket{op="prepare",le="0.004"}`:                   "1",
		`gpuiso_dra_operation_duration_seconds_bucket{op="prepare",le="+Inf"}`:                    "2",
		`gpuiso_dra_operation_duration_seconds_count{op="unprepare"}`:                             "1",
		`gpuiso_dra_operation_step_duration_seconds_count{op="prepare",step="allocate"}`:          "1",
		`gpuiso_dra_operation_step_duration_seconds_bucket{op="prepare",step="wait",le="0.0005"}`: "1",
	}
	for k, v := range want {
		g, err := strconv.ParseFloat(got[k], 64)
		w, _ := strconv.ParseFloat(v, 64)
		if err != nil || g != w {
			t.Errorf("%s = %q, want %s", k, got[k], v)
		}
	}
	for _, k := range []string{"process_resident_memory_bytes", "go_goroutines", `gpuiso_dra_operation_duration_seconds_sum{op="prepare"}`} {
		if _, ok := got[k]; !ok {
			t.Errorf("no %s", k)
		}
	}
	if t.Failed() {
		t.Logf("scraped: %v", got)
	}

	// Without a DRA driver: no claims or operations.
	reg, err = metricsRegistry(alloc, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ = scrape(t, metricsHandler(reg))
	for k := range got {
		if strings.HasPrefix(k, "gpuiso_claims_prepared") || strings.HasPrefix(k, "gpuiso_dra_") {
			t.Errorf("%s without a DRA driver", k)
		}
	}
	if got[`gpuiso_devices_held`] != "3" {
		t.Errorf("gpuiso_devices_held = %q without a DRA driver", got[`gpuiso_devices_held`])
	}

	srv := httptest.NewServer(metricsHandler(reg))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok\n" {
		t.Errorf("/healthz: %q", b)
	}
}
