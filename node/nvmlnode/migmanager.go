package nvmlnode

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/node"
)

// MIGManager makes and destroys MIG devices through NVML on GPUs whose MIG
// mode is enabled (dynamic MIG): a GPU instance at a placement with one
// compute instance spanning it, and the reverse. It never changes a GPU's
// MIG mode. Its methods are what allocator.WithMIGManager takes
// (allocator.MIGPlacer). NVML is initialised and shut down around each
// call; calls are serialised. Making MIG devices needs the rights NVML asks
// for (root, or the MIG config capability).
type MIGManager struct {
	cfg config
	mu  sync.Mutex
}

// NewMIGManager returns a MIG manager configured as Discover is (the NVML
// library, and the dev and proc roots where a new device's capability
// nodes are found).
func NewMIGManager(opts ...Option) (*MIGManager, error) {
	c := config{devRoot: node.DefaultDevRoot, procRoot: node.DefaultProcRoot, sysRoot: node.DefaultSysRoot}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("MIG manager: nil option: %w", node.ErrInvalid)
		}
		if err := opt(&c); err != nil {
			return nil, fmt.Errorf("MIG manager: %w", err)
		}
	}
	if c.lib == nil {
		c.lib = nvml.New()
	}
	return &MIGManager{cfg: c}, nil
}

// open initialises NVML and reads GPU parent: its handle and the device as
// discovery gives it, with its MIG profiles and devices.
func (m *MIGManager) open(ctx context.Context, parent string) (*discovery, nvml.Device, *node.Device, func(), error) {
	if err := m.made(); err != nil {
		return nil, nil, nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, nil, nil, err
	}
	if ret := m.cfg.lib.Init(); ret != nvml.SUCCESS {
		return nil, nil, nil, nil, nvmlError("init", -1, ret)
	}
	done := func() { m.cfg.lib.Shutdown() }
	h, ret := m.cfg.lib.DeviceGetHandleByUUID(parent)
	if ret != nvml.SUCCESS {
		done()
		return nil, nil, nil, nil, fmt.Errorf("GPU %s: %w", parent, nvmlError("get handle by uuid", -1, ret))
	}
	dev := &node.Device{UUID: parent, MIG: node.MIGEnabled, Minor: node.NoMinor}
	if i, ret := h.GetIndex(); ret == nvml.SUCCESS {
		dev.Index = i
	}
	if mode, _, ret := h.GetMigMode(); ret != nvml.SUCCESS || mode != nvml.DEVICE_MIG_ENABLE {
		done()
		return nil, nil, nil, nil, fmt.Errorf("GPU %s: MIG is not enabled: %w", parent, node.ErrNotSupported)
	}
	if minor, ret := h.GetMinorNumber(); ret == nvml.SUCCESS {
		dev.Minor = minor
	}
	d := &discovery{config: m.cfg, inv: &node.Inventory{}}
	d.readMajors()
	d.mig(&reader{index: dev.Index}, h, dev)
	return d, h, dev, done, nil
}

// CreateMIG makes a MIG device of profile on GPU parent at the first
// placement of the profile that is free.
func (m *MIGManager) CreateMIG(ctx context.Context, parent, profile string) (node.MIGDevice, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, _, dev, done, err := m.open(ctx, parent)
	if err != nil {
		return node.MIGDevice{}, fmt.Errorf("create MIG device %s: %w", profile, err)
	}
	p, ok := dev.MIGProfile(profile)
	done()
	if !ok {
		return node.MIGDevice{}, fmt.Errorf("create MIG device %s on %s: no such profile: %w", profile, parent, node.ErrInvalid)
	}
	for _, pl := range p.Placements {
		md, err := m.create(ctx, parent, profile, pl.Start)
		if errors.Is(err, node.ErrInsufficient) {
			continue
		}
		return md, err
	}
	return node.MIGDevice{}, fmt.Errorf("create MIG device %s on %s: no free placement: %w", profile, parent, node.ErrInsufficient)
}

// CreateMIGAt makes a GPU instance of profile at the placement that
// starts at memory slice start of GPU parent, and one compute instance
// spanning it, and returns the MIG device as discovery reads it (its
// capability nodes from the nvidia-caps driver's table). It is all or
// nothing: a GPU instance whose compute instance cannot be made is
// destroyed again. An instance in the way is an error matching
// node.ErrInsufficient; a profile or start the GPU does not have,
// node.ErrInvalid.
func (m *MIGManager) CreateMIGAt(ctx context.Context, parent, profile string, start int) (node.MIGDevice, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.create(ctx, parent, profile, start)
}

func (m *MIGManager) create(ctx context.Context, parent, profile string, start int) (node.MIGDevice, error) {
	d, h, dev, done, err := m.open(ctx, parent)
	if err != nil {
		return node.MIGDevice{}, fmt.Errorf("create MIG device %s at %d: %w", profile, start, err)
	}
	defer done()
	md, err := m.make(d, h, dev, profile, start)
	if err != nil {
		return node.MIGDevice{}, fmt.Errorf("create MIG device %s at %d of GPU %d: %w", profile, start, dev.Index, err)
	}
	return md, nil
}

func (m *MIGManager) make(d *discovery, h nvml.Device, dev *node.Device, profile string, start int) (node.MIGDevice, error) {
	p, ok := dev.MIGProfile(profile)
	if !ok {
		return node.MIGDevice{}, fmt.Errorf("no such profile: %w", node.ErrInvalid)
	}
	size := 0
	for _, pl := range p.Placements {
		if pl.Start == start {
			size = pl.Size
		}
	}
	if size == 0 {
		return node.MIGDevice{}, fmt.Errorf("not one of the profile's placements %v: %w", p.Placements, node.ErrInvalid)
	}
	var info nvml.GpuInstanceProfileInfo
	found := false
	for idx := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		if in, ret := h.GetGpuInstanceProfileInfo(idx); ret == nvml.SUCCESS && int(in.Id) == p.ID {
			info, found = in, true
			break
		}
	}
	if !found {
		return node.MIGDevice{}, fmt.Errorf("profile id %d: %w", p.ID, node.ErrInvalid)
	}
	gi, ret := h.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(start), Size: uint32(size)})
	if ret != nvml.SUCCESS {
		return node.MIGDevice{}, nvmlError("create gpu instance with placement", dev.Index, ret)
	}
	ci, err := fullComputeInstance(gi, p.Slices, dev.Index)
	if err != nil {
		if ret := gi.Destroy(); ret != nvml.SUCCESS {
			err = errors.Join(err, nvmlError("destroy gpu instance", dev.Index, ret))
		}
		return node.MIGDevice{}, err
	}
	undo := func(err error) (node.MIGDevice, error) {
		if ret := ci.Destroy(); ret != nvml.SUCCESS {
			return node.MIGDevice{}, errors.Join(err, nvmlError("destroy compute instance", dev.Index, ret))
		}
		if ret := gi.Destroy(); ret != nvml.SUCCESS {
			return node.MIGDevice{}, errors.Join(err, nvmlError("destroy gpu instance", dev.Index, ret))
		}
		return node.MIGDevice{}, err
	}
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return undo(nvmlError("get gpu instance info", dev.Index, ret))
	}
	ciInfo, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		return undo(nvmlError("get compute instance info", dev.Index, ret))
	}
	mh, err := migHandle(h, dev.Index, func(mh nvml.Device) bool {
		g, r1 := mh.GetGpuInstanceId()
		c, r2 := mh.GetComputeInstanceId()
		return r1 == nvml.SUCCESS && r2 == nvml.SUCCESS && g == int(giInfo.Id) && c == int(ciInfo.Id)
	})
	if err != nil {
		return undo(err)
	}
	md, err := d.migDevice(h, mh, dev)
	if err != nil {
		return undo(err)
	}
	return md, nil
}

// fullComputeInstance makes the compute instance of gi that spans its
// slices, with shared engines.
func fullComputeInstance(gi nvml.GpuInstance, slices, index int) (nvml.ComputeInstance, error) {
	for idx := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := gi.GetComputeInstanceProfileInfo(idx, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS || int(info.SliceCount) != slices {
			continue
		}
		ci, ret := gi.CreateComputeInstance(&info)
		if ret != nvml.SUCCESS {
			return nil, nvmlError("create compute instance", index, ret)
		}
		return ci, nil
	}
	return nil, fmt.Errorf("no compute-instance profile of %d slices: %w", slices, node.ErrNotSupported)
}

// migHandle finds the MIG device of h that match accepts.
func migHandle(h nvml.Device, index int, match func(nvml.Device) bool) (nvml.Device, error) {
	n, ret := h.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, nvmlError("get max mig device count", index, ret)
	}
	for k := range n {
		mh, ret := h.GetMigDeviceHandleByIndex(k)
		if ret == nvml.SUCCESS && match(mh) {
			return mh, nil
		}
	}
	return nil, fmt.Errorf("MIG device: %w", node.ErrNotFound)
}

// DestroyMIG destroys the MIG device with UUID device of GPU parent: its
// compute instance, then its GPU instance. A device the GPU does not have
// is an error matching node.ErrNotFound.
func (m *MIGManager) DestroyMIG(ctx context.Context, parent, device string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.destroy(ctx, parent, device); err != nil {
		return fmt.Errorf("destroy MIG device %s of %s: %w", device, parent, err)
	}
	return nil
}

// made refuses a MIGManager that NewMIGManager did not make (it has no
// NVML library).
func (m *MIGManager) made() error {
	if m.cfg.lib == nil {
		return fmt.Errorf("MIG manager not made by NewMIGManager: %w", node.ErrInvalid)
	}
	return nil
}

func (m *MIGManager) destroy(ctx context.Context, parent, device string) error {
	if err := m.made(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if ret := m.cfg.lib.Init(); ret != nvml.SUCCESS {
		return nvmlError("init", -1, ret)
	}
	defer m.cfg.lib.Shutdown()
	h, ret := m.cfg.lib.DeviceGetHandleByUUID(parent)
	if ret != nvml.SUCCESS {
		return nvmlError("get handle by uuid", -1, ret)
	}
	index, _ := h.GetIndex()
	mh, err := migHandle(h, index, func(mh nvml.Device) bool {
		u, ret := mh.GetUUID()
		return ret == nvml.SUCCESS && u == device
	})
	if err != nil {
		return err
	}
	g, ret := mh.GetGpuInstanceId()
	if ret != nvml.SUCCESS {
		return nvmlError("get gpu instance id", index, ret)
	}
	c, ret := mh.GetComputeInstanceId()
	if ret != nvml.SUCCESS {
		return nvmlError("get compute instance id", index, ret)
	}
	gi, ret := h.GetGpuInstanceById(g)
	if ret != nvml.SUCCESS {
		return nvmlError("get gpu instance by id", index, ret)
	}
	ci, ret := gi.GetComputeInstanceById(c)
	if ret != nvml.SUCCESS {
		return nvmlError("get compute instance by id", index, ret)
	}
	if ret := ci.Destroy(); ret != nvml.SUCCESS {
		return nvmlError("destroy compute instance", index, ret)
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		return nvmlError("destroy gpu instance", index, ret)
	}
	return nil
}
