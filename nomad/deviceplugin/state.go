package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
	"github.com/gpuiso/gpuiso/volume"
)

// state is one configuration in force: the node, the allocator over it,
// and the watchers that keep its health and holds current.
type state struct {
	cfg     Config
	log     *slog.Logger
	notify  func()
	started time.Time

	// Nil when the plugin is disabled.
	inv   *node.Inventory
	alloc *allocator.Allocator
	lib   nvml.Interface
	nomad *nomadClient // devices mode: where the node's allocations are read

	// holdMu makes holding (Reserve) and giving back (giveBack) one
	// step each: a device is never given back between the two halves
	// of its reservation.
	holdMu sync.Mutex

	mu     sync.Mutex
	known  map[string]offer     // the last fingerprint's devices by id
	heldAt map[string]time.Time // when Reserve last handed a device out
	vols   *volume.Manager      // built on the first reservation that needs it
	vol    *volume.Volume

	cancel context.CancelFunc
	wg     sync.WaitGroup
	nvmlUp bool

	// life guards the allocator and NVML against close: calls hold it
	// for reading (enter, leave), close for writing.
	life   sync.RWMutex
	closed bool
}

// enter reports whether st is still open, and keeps it so until leave.
func (st *state) enter() bool {
	st.life.RLock()
	if st.closed {
		st.life.RUnlock()
		return false
	}
	return true
}

func (st *state) leave() { st.life.RUnlock() }

// open discovers the node cfg describes and starts its watchers.
func open(ctx context.Context, cfg Config, sim *simnode.Node, log *slog.Logger, notify func()) (*state, error) {
	st := &state{cfg: cfg, log: log, notify: notify, started: time.Now(), known: map[string]offer{}, heldAt: map[string]time.Time{}}
	if !cfg.Enabled {
		return st, nil
	}
	inv, lib, err := discover(ctx, cfg, sim)
	if err != nil {
		return nil, err
	}
	opts := []allocator.Option{allocator.WithLogger(log)}
	if cfg.StateDir != "" {
		opts = append(opts, allocator.WithStateDir(cfg.StateDir))
	}
	alloc, err := allocator.New(inv, opts...)
	if err != nil {
		return nil, fmt.Errorf("allocator state: %w", err)
	}
	st.inv, st.alloc, st.lib = inv, alloc, lib
	if cfg.Env == EnvDevices {
		if st.nomad, err = newNomadClient(cfg); err != nil {
			return nil, errors.Join(err, alloc.Close())
		}
	}
	// NVML stays initialised for the statistics; the health monitor
	// initialises it for itself too.
	st.nvmlUp = lib.Init() == nvml.SUCCESS
	run, cancel := context.WithCancel(context.WithoutCancel(ctx))
	st.cancel = cancel
	st.wg.Add(1)
	go func() {
		defer st.wg.Done()
		err := nvmlnode.Monitor(run, lib, alloc, func(ev nvmlnode.HealthEvent) {
			log.Warn("GPU health", "gpu", ev.Device.UUID, "xid", ev.XID, "owners", ev.Owners, "err", ev.Err)
			notify()
		})
		if err != nil && !errors.Is(err, context.Canceled) {
			log.Warn("health monitor stopped", "err", err)
		}
	}()
	if cfg.Env == EnvDevices {
		st.wg.Add(1)
		go func() {
			defer st.wg.Done()
			st.keepHolds(run)
		}()
	}
	return st, nil
}

// discover reads the node's GPUs, real or simulated (sim, when it has the
// topology cfg names), and returns the NVML library that answers for them.
func discover(ctx context.Context, cfg Config, sim *simnode.Node) (*node.Inventory, nvml.Interface, error) {
	if cfg.Simulate != "" {
		if sim == nil || sim.Name() != cfg.Simulate {
			var err error
			if sim, err = simnode.New(cfg.Simulate); err != nil {
				return nil, nil, err
			}
		}
		host, err := sim.OpenHost(ctx, cfg.DevRoot)
		if err != nil {
			return nil, nil, fmt.Errorf("simulated node %s in %s: %w", cfg.Simulate, cfg.DevRoot, err)
		}
		inv, err := nvmlnode.Discover(ctx, sim.DiscoverOptions(host)...)
		if err != nil {
			return nil, nil, fmt.Errorf("discover the simulated node: %w", err)
		}
		return inv, sim.NVML(), nil
	}
	lib := nvml.New()
	if cfg.DriverRoot != "" {
		m, err := volume.New(volume.WithDriverRoot(cfg.DriverRoot))
		if err != nil {
			return nil, nil, err
		}
		p, err := m.Library(ctx, "libnvidia-ml.so.1")
		if err != nil {
			return nil, nil, fmt.Errorf("NVML under %s: %w", cfg.DriverRoot, err)
		}
		lib = nvml.New(nvml.WithLibraryPath(p))
	}
	opts := []nvmlnode.Option{nvmlnode.WithNVML(lib)}
	if cfg.DevRoot != "" {
		opts = append(opts, nvmlnode.WithDevRoot(cfg.DevRoot))
	}
	inv, err := nvmlnode.Discover(ctx, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("discover the node's GPUs: %w", err)
	}
	return inv, lib, nil
}

// close stops the watchers and lets go of the state directory.
func (st *state) close() error {
	if st.cancel != nil {
		st.cancel()
	}
	st.wg.Wait()
	st.life.Lock()
	defer st.life.Unlock()
	if st.closed {
		return nil
	}
	st.closed = true
	var errs []error
	if st.nvmlUp {
		if r := st.lib.Shutdown(); r != nvml.SUCCESS {
			errs = append(errs, fmt.Errorf("nvml shutdown: %s", r.Error()))
		}
	}
	if st.alloc != nil {
		errs = append(errs, st.alloc.Close())
	}
	return errors.Join(errs...)
}

// volume returns the driver volume, built on first use.
func (st *state) volume(ctx context.Context) (*volume.Manager, *volume.Volume, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.vol != nil {
		return st.vols, st.vol, nil
	}
	var opts []volume.Option
	if st.cfg.DriverRoot != "" {
		opts = append(opts, volume.WithDriverRoot(st.cfg.DriverRoot))
	}
	m, err := volume.New(opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("driver volume: %w", err)
	}
	v, err := m.Build(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("driver volume: %w", err)
	}
	st.vols, st.vol = m, v
	return m, v, nil
}
