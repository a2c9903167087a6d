package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
)

// latencyBuckets are the bounds of the prepare and unprepare histograms,
// in seconds: 0.5 ms to about 16 s, doubling.
var latencyBuckets = prometheus.ExponentialBuckets(0.0005, 2, 16)

// draMetrics counts and times the DRA driver's prepares and unprepares:
// it is the driver's dra.Observer.
type draMetrics struct {
	ops     *prometheus.CounterVec   // op, result
	latency *prometheus.HistogramVec // op
	steps   *prometheus.HistogramVec // op, step
}

func newDRAMetrics() *draMetrics {
	return &draMetrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuiso_dra_operations_total",
			Help: "DRA claims prepared and unprepared, by operation (prepare, unprepare) and result (success, error).",
		}, []string{"op", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpuiso_dra_operation_duration_seconds",
			Help:    "Time from the kubelet's call to the answer, for one claim, by operation (prepare, unprepare).",
			Buckets: latencyBuckets,
		}, []string{"op"}),
		steps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpuiso_dra_operation_step_duration_seconds",
			Help:    "Time of each step of a claim's prepare or unprepare (wait, read, restore, started, allocate, spec, completed, rollback).",
			Buckets: latencyBuckets,
		}, []string{"op", "step"}),
	}
}

// Observe counts and times ev.
func (m *draMetrics) Observe(ev dra.Event) {
	result := "success"
	if ev.Err != nil {
		result = "error"
	}
	op := string(ev.Op)
	m.ops.WithLabelValues(op, result).Inc()
	m.latency.WithLabelValues(op).Observe(ev.Took.Seconds())
	// A step that ran several times (waits) is observed once, summed.
	seen := map[string]bool{}
	for _, s := range ev.Steps {
		if !seen[s.Name] {
			seen[s.Name] = true
			m.steps.WithLabelValues(op, s.Name).Observe(ev.Step(s.Name).Seconds())
		}
	}
}

// nodeCollector reads the node's state from the allocator at each scrape:
// devices by health, devices held, and each GPU's shares and memory held;
// and the claims prepared, when prepared is set.
type nodeCollector struct {
	alloc    *allocator.Allocator
	prepared func() int

	gpus, migs, held, claims, shares, memHeld, memTotal *prometheus.Desc
}

func newNodeCollector(alloc *allocator.Allocator, prepared func() int) *nodeCollector {
	gpu := []string{"gpu", "index"}
	return &nodeCollector{
		alloc:    alloc,
		prepared: prepared,
		gpus:     prometheus.NewDesc("gpuiso_gpus", "The node's GPUs by health.", []string{"health"}, nil),
		migs:     prometheus.NewDesc("gpuiso_mig_devices", "The node's MIG devices by health.", []string{"health"}, nil),
		held:     prometheus.NewDesc("gpuiso_devices_held", "Devices (GPUs, MIG devices, shares of a GPU) held by pods and claims.", nil, nil),
		claims:   prometheus.NewDesc("gpuiso_claims_prepared", "DRA claims prepared on the node.", nil, nil),
		shares:   prometheus.NewDesc("gpuiso_gpu_shares", "Shares of the GPU held (memory shares and time slices).", gpu, nil),
		memHeld: prometheus.NewDesc("gpuiso_gpu_memory_held_bytes",
			"The GPU's memory held by pods and claims: its memory shares, its MIG devices held, or all of it when held whole.", gpu, nil),
		memTotal: prometheus.NewDesc("gpuiso_gpu_memory_bytes", "The GPU's memory.", gpu, nil),
	}
}

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.gpus, c.migs, c.held, c.shares, c.memHeld, c.memTotal} {
		ch <- d
	}
	if c.prepared != nil {
		ch <- c.claims
	}
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	devices := c.alloc.Devices()
	type gpuUse struct {
		shares int
		held   uint64
	}
	use := map[string]*gpuUse{} // by the GPU's UUID
	// Each device's memory, and the GPU it is part of, by UUID.
	memory, parent := map[string]uint64{}, map[string]string{}
	var gpus, migs [2]int // unhealthy, healthy
	for _, d := range devices {
		gpus[b2i(d.Health.Healthy)]++
		use[d.UUID] = &gpuUse{}
		memory[d.UUID], parent[d.UUID] = d.MemoryBytes, d.UUID
		for _, m := range d.MIGDevices {
			migs[b2i(m.Health.Healthy)]++
			memory[m.UUID], parent[m.UUID] = m.MemoryBytes, d.UUID
		}
	}
	held := 0
	for _, a := range c.alloc.Allocations() {
		held += len(a.Devices)
		for _, ref := range a.Devices {
			u := use[parent[ref.UUID]]
			switch {
			case u == nil:
			case a.Share != nil:
				u.shares++
				u.held += a.Share.MemoryBytes
			default:
				u.held += memory[ref.UUID]
			}
		}
	}
	for i, h := range []string{"unhealthy", "healthy"} {
		ch <- prometheus.MustNewConstMetric(c.gpus, prometheus.GaugeValue, float64(gpus[i]), h)
		ch <- prometheus.MustNewConstMetric(c.migs, prometheus.GaugeValue, float64(migs[i]), h)
	}
	ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(held))
	if c.prepared != nil {
		ch <- prometheus.MustNewConstMetric(c.claims, prometheus.GaugeValue, float64(c.prepared()))
	}
	for _, d := range devices {
		labels := []string{d.UUID, strconv.Itoa(d.Index)}
		u := use[d.UUID]
		ch <- prometheus.MustNewConstMetric(c.shares, prometheus.GaugeValue, float64(u.shares), labels...)
		ch <- prometheus.MustNewConstMetric(c.memHeld, prometheus.GaugeValue, float64(u.held), labels...)
		ch <- prometheus.MustNewConstMetric(c.memTotal, prometheus.GaugeValue, float64(d.MemoryBytes), labels...)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// metricsRegistry is the program's own registry (never the global one):
// the node's state, the DRA driver's operations (dra, when set), and the
// process's and Go runtime's collectors.
func metricsRegistry(alloc *allocator.Allocator, prepared func() int, dra *draMetrics) (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	cs := []prometheus.Collector{
		newNodeCollector(alloc, prepared),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}
	if dra != nil {
		cs = append(cs, dra.ops, dra.latency, dra.steps)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	return reg, nil
}

// metricsHandler serves reg at /metrics (Prometheus's text or protobuf
// format, as the scraper asks) and "ok" at /healthz.
func metricsHandler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return mux
}

// serveMetrics serves h on addr until ctx ends. With wait, an address in
// use (the instance this one replaces, on the node's network) is taken
// once it is free, trying again every second meanwhile.
func serveMetrics(ctx context.Context, addr string, h http.Handler, wait bool, log *slog.Logger) error {
	l, err := net.Listen("tcp", addr)
	if err != nil && wait && errors.Is(err, syscall.EADDRINUSE) {
		log.Info("the metrics address is in use: serving it once it is free", "address", addr)
		go func() {
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				if err := serveMetrics(ctx, addr, h, false, log); err == nil {
					return
				} else if !errors.Is(err, syscall.EADDRINUSE) {
					log.Warn("metrics not served", "err", err)
					return
				}
			}
		}()
		return nil
	}
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("metrics server stopped", "err", err)
		}
	}()
	return nil
}
