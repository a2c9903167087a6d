package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/node"
)

// Source gives the node's GPUs with their current health: an
// *allocator.Allocator, which nvmlnode.Monitor marks.
type Source interface {
	Devices() []node.Device
}

// Holders is what a Source may also tell: who holds a device (by UUID). An
// *allocator.Allocator does; the device plugin then refuses to hand out a
// device that a DRA claim holds.
type Holders interface {
	Owners(device string) ([]string, error)
}

// The allocator is a Source and tells its Holders (the plugin asks for
// them by a type assertion, which a changed signature would fail quietly).
var (
	_ Source  = (*allocator.Allocator)(nil)
	_ Holders = (*allocator.Allocator)(nil)
)

// Config configures a Manager.
type Config struct {
	// ResourceName is the whole GPUs' resource, "<domain>/<name>"
	// (default "nvidia.com/gpu"); MIG profiles get their own resources in
	// its domain.
	ResourceName string
	// Dir is the kubelet's device-plugin directory, where kubelet.sock and
	// the plugins' sockets live (default pluginapi.DevicePluginPath).
	Dir string
	// CDIKind is the kind of the node's CDI spec that Allocate names
	// devices in (default cdi.DefaultKind).
	CDIKind string
	// DeviceSpecs makes Allocate also answer with device nodes, for
	// runtimes that do not read CDI.
	DeviceSpecs bool
	// Shared are the UUIDs of the GPUs served as time slices instead of
	// whole: Replicas devices each under SharedResourceName, which
	// Allocate holds in the allocator as time slices (the Source must be
	// a TimeSlicer, whose count of time slices per GPU allows Replicas).
	// Time slices isolate nothing from each other.
	Shared []string
	// Replicas is how many time slices of each shared GPU are served
	// (default allocator.DefaultTimeSlices).
	Replicas int
	// SharedResourceName is the time slices' resource (default
	// DefaultSharedResourceName).
	SharedResourceName string
	// Strategy is how the replicas of a shared GPU share it: time slices
	// (StrategyTimeSlicing, the default: "" is it) or concurrent slices
	// enforced by MPS (StrategyMPS: Replicas from allocator.MinSlices to
	// allocator.MaxSlices, each held as allocator.ShareSlice with Slices
	// Replicas, and MPS runs the daemons).
	Strategy Strategy
	// MPS runs the MPS daemons of the concurrent slices (StrategyMPS),
	// one per sliced GPU: an *mps.Manager of a directory of its own.
	MPS SliceDaemons
	// PodResources is the kubelet's pod-resources socket, which Adopt and
	// Reconcile ask (default DefaultPodResources).
	PodResources string
	// TimeSliceGrace is how long Reconcile leaves a device or time slice
	// just taken (default DefaultTimeSliceGrace).
	TimeSliceGrace time.Duration
	// Logger, when set, receives the manager's events.
	Logger *slog.Logger
	// HeldChanged, when set, is called once what the plugin holds in the
	// allocator changed: after Allocate held a container's devices or
	// time slices, after Reconcile gave some back and after Adopt held
	// some. A DRA driver on the same allocator publishes the devices held
	// so with a taint (dra.HeldTaint): calling its publish from here
	// taints a device the moment a pod has it, not at the next refresh.
	// It is called on the caller's goroutine and must not block long.
	HeldChanged func()
}

// heldChanged calls Config.HeldChanged.
func (c *Config) heldChanged() {
	if c.HeldChanged != nil {
		c.HeldChanged()
	}
}

func (c *Config) defaults() error {
	if c.ResourceName == "" {
		c.ResourceName = "nvidia.com/gpu"
	}
	if c.Dir == "" {
		c.Dir = pluginapi.DevicePluginPath
	}
	if c.CDIKind == "" {
		c.CDIKind = cdi.DefaultKind
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := cdi.ValidateKind(c.CDIKind); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.PodResources == "" {
		c.PodResources = DefaultPodResources
	}
	if c.TimeSliceGrace == 0 {
		c.TimeSliceGrace = DefaultTimeSliceGrace
	}
	strategy, err := ParseStrategy(string(c.Strategy))
	if err != nil {
		return err
	}
	c.Strategy = strategy
	if len(c.Shared) > 0 {
		if c.SharedResourceName == "" {
			c.SharedResourceName = DefaultSharedResourceName
		}
		if c.Replicas == 0 {
			c.Replicas = allocator.DefaultTimeSlices
		}
		if c.Replicas < 1 {
			return fmt.Errorf("%d time slices per GPU: %w", c.Replicas, ErrInvalidConfig)
		}
		if c.Strategy == StrategyMPS {
			if c.Replicas < allocator.MinSlices || c.Replicas > allocator.MaxSlices {
				return fmt.Errorf("%d concurrent slices per GPU, want %d to %d: %w", c.Replicas, allocator.MinSlices, allocator.MaxSlices, ErrInvalidConfig)
			}
			if c.MPS == nil {
				return fmt.Errorf("concurrent slices need their MPS daemons (Config.MPS): %w", ErrInvalidConfig)
			}
		}
		if c.SharedResourceName == c.ResourceName {
			return fmt.Errorf("time slices and whole GPUs under one resource %q: %w", c.ResourceName, ErrInvalidConfig)
		}
		if err := validResourceName(c.SharedResourceName); err != nil {
			return err
		}
	}
	return validResourceName(c.ResourceName)
}

// Manager serves and registers one Plugin per resource of the node.
type Manager struct {
	cfg Config
	inv *node.Inventory
	src Source

	book *sliceBook

	mu         sync.Mutex
	plugins    map[string]*Plugin
	registered chan struct{} // closed and replaced after each registration round
	lastErr    error
}

// New returns a Manager for the GPUs of inv whose health src gives.
func New(inv *node.Inventory, src Source, cfg Config) (*Manager, error) {
	if inv == nil || src == nil {
		return nil, fmt.Errorf("device plugin needs an inventory and a health source: %w", ErrInvalidConfig)
	}
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if _, ok := src.(TimeSlicer); len(cfg.Shared) > 0 && !ok {
		return nil, fmt.Errorf("time slices need a source that holds them (an allocator): %w", ErrInvalidConfig)
	}
	res, err := cfg.resources(src.Devices())
	if err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, inv: inv, src: src, book: &sliceBook{}, plugins: map[string]*Plugin{}, registered: make(chan struct{})}
	for name, devs := range res {
		m.plugins[name] = newPlugin(name, filepath.Join(cfg.Dir, socketName(name)), inv, &m.cfg, src, devs)
		m.plugins[name].book = m.book
	}
	return m, nil
}

// Plugins returns the plugins, one per resource, sorted by resource.
func (m *Manager) Plugins() []*Plugin {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*Plugin, 0, len(m.plugins))
	for _, n := range ResourceNames(toDevices(m.plugins)) {
		out = append(out, m.plugins[n])
	}
	return out
}

func toDevices(p map[string]*Plugin) map[string][]Device {
	out := make(map[string][]Device, len(p))
	for k := range p {
		out[k] = nil
	}
	return out
}

// Registered returns a channel closed after the next registration round
// (all plugins served and registered, or failed).
func (m *Manager) Registered() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.registered
}

// Refresh reads the devices' health from the source again and sends every
// resource whose devices changed to its ListAndWatch streams. It reports
// whether anything changed.
func (m *Manager) Refresh() (bool, error) {
	res, err := m.cfg.resources(m.src.Devices())
	if err != nil {
		return false, err
	}
	changed := false
	for _, p := range m.Plugins() {
		if p.update(res[p.resource]) {
			changed = true
			m.cfg.Logger.Info("device health changed", "resource", p.resource)
		}
	}
	return changed, nil
}

// Run serves every plugin, registers them with the kubelet, and does so
// again whenever the kubelet restarts (kubelet.sock created anew), until
// ctx ends; it then stops the servers and removes their sockets. A
// registration that fails after a few tries is logged and kept in Err; the
// kubelet's next start brings another round. Run fails only when it cannot
// watch the directory.
func (m *Manager) Run(ctx context.Context) error {
	if err := os.MkdirAll(m.cfg.Dir, 0o755); err != nil {
		return fmt.Errorf("device-plugin directory: %w", err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", m.cfg.Dir, err)
	}
	defer w.Close()
	if err := w.Add(m.cfg.Dir); err != nil {
		return fmt.Errorf("watch %s: %w", m.cfg.Dir, err)
	}
	defer m.stopAll()
	kubelet := filepath.Join(m.cfg.Dir, "kubelet.sock")
	m.start(ctx, kubelet)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if ev.Name == kubelet && ev.Has(fsnotify.Create) {
				m.cfg.Logger.Info("kubelet restarted: registering again")
				m.start(ctx, kubelet)
			}
		case err, ok := <-w.Errors:
			if ok {
				m.cfg.Logger.Warn("watching the device-plugin directory", "err", err)
			}
		}
	}
}

// start serves every plugin afresh and registers it. A plugin that cannot
// be served or registered is logged and left for the next round (the
// kubelet's next start); the others go on.
func (m *Manager) start(ctx context.Context, kubelet string) {
	m.stopAll()
	var errs []error
	for _, p := range m.Plugins() {
		if err := p.serve(ctx); err != nil {
			errs = append(errs, fmt.Errorf("serve %s: %w", p.resource, err))
			continue
		}
		if err := registerRetry(ctx, kubelet, p); err != nil {
			m.cfg.Logger.Warn("registration", "resource", p.resource, "err", err)
			errs = append(errs, err)
			continue
		}
		m.cfg.Logger.Info("registered", "resource", p.resource, "socket", p.socket)
	}
	m.mu.Lock()
	close(m.registered)
	m.registered = make(chan struct{})
	m.mu.Unlock()
	m.mu.Lock()
	m.lastErr = errors.Join(errs...)
	m.mu.Unlock()
}

// Err returns what went wrong in the last registration round, or nil.
func (m *Manager) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastErr
}

func (m *Manager) stopAll() {
	for _, p := range m.Plugins() {
		p.stop()
	}
}

var errNoKubelet = node.Sentinel(node.ErrUnavailable, "kubelet not reachable")

// registerRetry registers p, trying again a few times a second apart: a
// kubelet whose socket just appeared may not answer yet.
func registerRetry(ctx context.Context, socket string, p *Plugin) error {
	var err error
	for try := range 5 {
		if try > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
		}
		if err = register(ctx, socket, p); err == nil {
			return nil
		}
	}
	return err
}

// register tells the kubelet at socket about p.
func register(ctx context.Context, socket string, p *Plugin) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("register %s: %w: %w", p.resource, errNoKubelet, err)
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: p.resource,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	}, grpc.WaitForReady(false))
	if err != nil {
		return fmt.Errorf("register %s: %w: %w", p.resource, ErrRegister, err)
	}
	return nil
}
