package dra

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpuiso/gpuiso/node"
)

// DefaultHealthResend is how often WatchHealthStatus sends the devices'
// health again when it did not change: well within the kubelet's 30 s
// health timeout, after which it reports a device's health as unknown.
const DefaultHealthResend = 10 * time.Second

// healthDefaults fills in the taint key and the resend interval, and
// checks them.
func (c *Config) healthDefaults() error {
	if c.HealthResend < 0 {
		return fmt.Errorf("health resend interval %s: %w", c.HealthResend, ErrInvalidConfig)
	}
	if c.HealthResend == 0 {
		c.HealthResend = DefaultHealthResend
	}
	if c.LeaveOutUnhealthy {
		c.Slice.TaintKey = ""
		return nil
	}
	if c.Slice.TaintKey == "" {
		c.Slice.TaintKey = TaintKey(c.DriverName)
	}
	if errs := validation.IsQualifiedName(c.Slice.TaintKey); len(errs) > 0 {
		return fmt.Errorf("taint key %q: %s: %w", c.Slice.TaintKey, strings.Join(errs, "; "), ErrInvalidConfig)
	}
	return nil
}

// HealthReport is the health of every device the driver publishes (or
// would publish, were it healthy) in the node's pool (Config.NodeName),
// as the allocator has it now: Healthy, or Unhealthy with the reasons (a
// MIG device's own, then its parent's) as the message. The kubelet shows
// it for a pod's prepared devices in its containers'
// allocatedResourcesStatus.
func (d *Driver) HealthReport() kubeletplugin.DeviceHealthReport {
	now := time.Now()
	var out kubeletplugin.DeviceHealthReport
	add := func(name string, hs ...node.Health) {
		h := kubeletplugin.DeviceHealth{PoolName: d.cfg.NodeName, DeviceName: name, Health: kubeletplugin.HealthStatusHealthy, LastUpdated: now, HealthCheckTimeout: healthTimeout(d.cfg.HealthResend)}
		var why []string
		for _, x := range hs {
			if !x.Healthy {
				why = append(why, x.String())
			}
		}
		if len(why) > 0 {
			h.Health, h.Message = kubeletplugin.HealthStatusUnhealthy, strings.Join(why, "; ")
		}
		out.Devices = append(out.Devices, h)
	}
	for _, dev := range d.alloc.Devices() {
		switch {
		case dev.UUID == "":
		case dev.MIGSplit():
			for _, m := range dev.MIGDevices {
				if m.UUID != "" {
					add(MIGDeviceName(m), m.Health, dev.Health)
				}
			}
		case slices.Contains(d.cfg.Slice.Shared, dev.UUID):
			add(ShareDeviceName(dev), dev.Health)
		default:
			add(DeviceName(dev), dev.Health)
		}
	}
	return out
}

// healthTimeout is how long the kubelet trusts a report sent every
// resend: three periods, at least its default of 30 s.
func healthTimeout(resend time.Duration) time.Duration {
	return max(3*resend, 30*time.Second)
}

// NotifyHealth tells the driver that the devices' health may have changed
// (the caller marked a device, or read the allocator's state again):
// every WatchHealthStatus sends a report at once if it did.
func (d *Driver) NotifyHealth() { d.health.notify() }

// WatchHealthStatus reports the devices' health to the kubelet (KEP-4680):
// a first HealthReport, then one each time NotifyHealth finds it changed,
// and the same again every Config.HealthResend, until ctx ends (then it
// returns nil). Without Config.NodeName it reports nothing
// (kubeletplugin.ErrHealthNotSupported).
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	if d.cfg.NodeName == "" {
		return kubeletplugin.ErrHealthNotSupported
	}
	tick := time.NewTicker(d.cfg.HealthResend)
	defer tick.Stop()
	var last kubeletplugin.DeviceHealthReport
	resend := true
	for {
		wake := d.health.wait()
		r := d.HealthReport()
		if resend || !sameHealth(r, last) {
			select {
			case <-ctx.Done():
				return nil
			case reports <- r:
			}
			last = r
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
			resend = false
		case <-tick.C:
			resend = true
		}
	}
}

// sameHealth tells whether two reports say the same of the same devices,
// whenever they were made.
func sameHealth(a, b kubeletplugin.DeviceHealthReport) bool {
	return slices.EqualFunc(a.Devices, b.Devices, func(x, y kubeletplugin.DeviceHealth) bool {
		x.LastUpdated, y.LastUpdated = time.Time{}, time.Time{}
		return x == y
	})
}

// healthWaiters wakes the WatchHealthStatus calls waiting for a change.
// The zero value is ready.
type healthWaiters struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns a channel closed at the next notify.
func (w *healthWaiters) wait() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

func (w *healthWaiters) notify() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
}
