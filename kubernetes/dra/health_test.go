package dra_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
)

// healthDriver is a driver of a simulated DGX-1 (no host tree: health
// needs none) for node "node-1".
func healthDriver(t *testing.T, resend time.Duration) (*dra.Driver, *allocator.Allocator) {
	t.Helper()
	_, inv := inventory(t, "dgx1-volta")
	a, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dra.New(inv, a, dra.Config{StateDir: t.TempDir(), CDIDir: t.TempDir(), NodeName: "node-1", HealthResend: resend})
	if err != nil {
		t.Fatal(err)
	}
	return d, a
}

// next is the next report of the stream, or a failure after a guard
// against a hang.
func next(t *testing.T, reports <-chan kubeletplugin.DeviceHealthReport) kubeletplugin.DeviceHealthReport {
	t.Helper()
	select {
	case r := <-reports:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("no health report")
	}
	return kubeletplugin.DeviceHealthReport{}
}

func healthOf(r kubeletplugin.DeviceHealthReport) map[string]kubeletplugin.DeviceHealth {
	out := map[string]kubeletplugin.DeviceHealth{}
	for _, d := range r.Devices {
		out[d.DeviceName] = d
	}
	return out
}

// TestWatchHealthStatus: the stream starts with every device healthy, in
// the node's pool; a GPU marked unhealthy is reported Unhealthy with its
// reason as soon as the driver is notified, and Healthy again after;
// a notification that changes nothing sends nothing; the stream ends
// with nil when its context does.
func TestWatchHealthStatus(t *testing.T) {
	d, a := healthDriver(t, time.Hour)
	ctx, cancel := context.WithCancel(t.Context())
	reports := make(chan kubeletplugin.DeviceHealthReport)
	done := make(chan error, 1)
	go func() { done <- d.WatchHealthStatus(ctx, reports) }()

	first := healthOf(next(t, reports))
	if len(first) != 8 {
		t.Fatalf("first report of %d devices, want 8", len(first))
	}
	for name, h := range first {
		if h.Health != kubeletplugin.HealthStatusHealthy || h.PoolName != "node-1" || h.LastUpdated.IsZero() || h.HealthCheckTimeout < 30*time.Second {
			t.Errorf("%s: %+v", name, h)
		}
	}
	gpu := a.Devices()[5]
	if _, err := a.MarkUnhealthy(t.Context(), gpu.UUID, "XID 79"); err != nil {
		t.Fatal(err)
	}
	d.NotifyHealth()
	got := healthOf(next(t, reports))
	if h := got["gpu-5"]; h.Health != kubeletplugin.HealthStatusUnhealthy || h.Message != "unhealthy: XID 79" {
		t.Errorf("gpu-5 after XID 79: %+v", h)
	}
	if h := got["gpu-4"]; h.Health != kubeletplugin.HealthStatusHealthy {
		t.Errorf("gpu-4: %+v", h)
	}
	d.NotifyHealth() // nothing changed: nothing sent
	if err := a.MarkHealthy(t.Context(), gpu.UUID); err != nil {
		t.Fatal(err)
	}
	d.NotifyHealth()
	if h := healthOf(next(t, reports))["gpu-5"]; h.Health != kubeletplugin.HealthStatusHealthy {
		t.Errorf("gpu-5 healthy again: %+v", h)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("WatchHealthStatus after cancel: %v", err)
	}
}

// TestWatchHealthResend: with nothing changing, the report is sent again
// every HealthResend, within the kubelet's health timeout.
func TestWatchHealthResend(t *testing.T) {
	d, _ := healthDriver(t, 10*time.Millisecond)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	reports := make(chan kubeletplugin.DeviceHealthReport)
	go d.WatchHealthStatus(ctx, reports)
	for range 3 {
		if r := next(t, reports); len(r.Devices) != 8 {
			t.Fatalf("report of %d devices", len(r.Devices))
		}
	}
}

// TestWatchHealthNoNode: without the node's name (its pool) the driver
// reports no health.
func TestWatchHealthNoNode(t *testing.T) {
	_, inv := inventory(t, "dgx1-volta")
	a, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dra.New(inv, a, dra.Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.WatchHealthStatus(t.Context(), make(chan kubeletplugin.DeviceHealthReport)); !errors.Is(err, kubeletplugin.ErrHealthNotSupported) {
		t.Errorf("no node name: %v, want ErrHealthNotSupported", err)
	}
	if _, err := dra.New(inv, a, dra.Config{StateDir: t.TempDir(), HealthResend: -time.Second}); !errors.Is(err, dra.ErrInvalidConfig) {
		t.Errorf("negative resend: %v", err)
	}
}
