package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// scrapeMetrics reads the plugin's /metrics at addr: "name{labels}" to
// value.
func scrapeMetrics(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	m, err := tryMetrics(t, addr)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// tryMetrics is scrapeMetrics for a plugin that may not listen yet: a
// refused connection is its error.
func tryMetrics(t *testing.T, addr string) (map[string]float64, error) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s, %v", resp.Status, err)
	}
	out := map[string]float64{}
	for l := range strings.SplitSeq(string(b), "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", l, err)
		}
		out[l[:i]] = v
	}
	return out, nil
}

// freeAddr is a loopback address with a port free now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestMetrics scrapes the plugin's Prometheus endpoint (a simulated
// DGX-1, DRA driver alone) while a pod holds a claim for one GPU, and
// after the pod is gone: the claim prepared and counted, its latency in
// the histogram, its GPU held with all its memory, then the claim
// unprepared and nothing held.
func TestMetrics(t *testing.T) {
	c := requireCluster(t)
	ensureClasses(t, c)
	addr := freeAddr(t)
	startPlugin(t, c, "dgx1-volta", "--device-plugin=false", "--metrics-address", addr)
	until(t, "the slice's 8 GPUs", func() bool { return len(sliceDevices(t, c)) == 8 })
	m := scrapeMetrics(t, addr)
	if m[`gpuiso_gpus{health="healthy"}`] != 8 || m["gpuiso_devices_held"] != 0 || m["gpuiso_claims_prepared"] != 0 {
		t.Fatalf("before any claim: gpus %v, held %v, claims %v", m[`gpuiso_gpus{health="healthy"}`], m["gpuiso_devices_held"], m["gpuiso_claims_prepared"])
	}

	claimTemplate(t, c, "metrics-gpu", "gpu.gpuiso.io", 1, "")
	p := withClaim(probePod("metrics-gpu", []string{"do", "env", "NVIDIA_VISIBLE_DEVICES", "--", "cwd", "--", "sleep", "100000"}), "metrics-gpu")
	createPod(t, c, p)
	out := podOutput(t, c, p.Name)
	names, uuids, _ := allocated(t, c, p.Name, sliceByName(t, c))
	if len(uuids) != 1 || !strings.Contains(out, "NVIDIA_VISIBLE_DEVICES="+uuids[0]) {
		t.Fatalf("pod's devices %v %v; its output:\n%s", names, uuids, out)
	}
	m = scrapeMetrics(t, addr)
	index := strings.TrimPrefix(names[0], "gpu-")
	gpu := fmt.Sprintf(`{gpu="%s",index="%s"}`, uuids[0], index)
	for k, want := range map[string]float64{
		"gpuiso_claims_prepared": 1,
		"gpuiso_devices_held":    1,
		`gpuiso_dra_operations_total{op="prepare",result="success"}`:           1,
		`gpuiso_dra_operation_duration_seconds_count{op="prepare"}`:            1,
		`gpuiso_dra_operation_duration_seconds_bucket{op="prepare",le="+Inf"}`: 1,
	} {
		if m[k] != want {
			t.Errorf("with the pod running: %s = %v, want %v", k, m[k], want)
		}
	}
	if m["gpuiso_gpu_memory_held_bytes"+gpu] == 0 || m["gpuiso_gpu_memory_held_bytes"+gpu] != m["gpuiso_gpu_memory_bytes"+gpu] {
		t.Errorf("GPU %s held whole: memory held %v of %v", names[0], m["gpuiso_gpu_memory_held_bytes"+gpu], m["gpuiso_gpu_memory_bytes"+gpu])
	}
	if s := m[`gpuiso_dra_operation_duration_seconds_sum{op="prepare"}`]; s <= 0 {
		t.Errorf("the prepare's duration was not recorded: %v s", s)
	}
	t.Logf("the claim's prepare: %.1f ms (steps: started %.1f ms, allocate %.1f ms, spec %.1f ms, completed %.1f ms)",
		1000*m[`gpuiso_dra_operation_duration_seconds_sum{op="prepare"}`],
		1000*m[`gpuiso_dra_operation_step_duration_seconds_sum{op="prepare",step="started"}`],
		1000*m[`gpuiso_dra_operation_step_duration_seconds_sum{op="prepare",step="allocate"}`],
		1000*m[`gpuiso_dra_operation_step_duration_seconds_sum{op="prepare",step="spec"}`],
		1000*m[`gpuiso_dra_operation_step_duration_seconds_sum{op="prepare",step="completed"}`])

	deletePod(t, c, p.Name)
	until(t, "the claim unprepared in the metrics", func() bool {
		m = scrapeMetrics(t, addr)
		return m["gpuiso_claims_prepared"] == 0
	})
	if m["gpuiso_devices_held"] != 0 || m["gpuiso_gpu_memory_held_bytes"+gpu] != 0 || m[`gpuiso_dra_operations_total{op="unprepare",result="success"}`] < 1 {
		t.Errorf("after the pod: held %v, memory held %v, unprepares %v", m["gpuiso_devices_held"], m["gpuiso_gpu_memory_held_bytes"+gpu],
			m[`gpuiso_dra_operations_total{op="unprepare",result="success"}`])
	}
}
