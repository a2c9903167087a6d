package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/kubernetes/internal/unixsock"
	"github.com/gpuiso/gpuiso/node"
)

// Plugin serves one resource over the device-plugin API on its own socket.
// It is safe for concurrent use.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	resource string
	socket   string
	inv      *node.Inventory
	cfg      *Config
	src      Source
	book     *sliceBook

	mu      sync.Mutex
	devices []Device
	changed chan struct{} // closed and replaced when devices change
	server  *grpc.Server
	done    chan struct{}
}

func newPlugin(resource, socket string, inv *node.Inventory, cfg *Config, src Source, devices []Device) *Plugin {
	return &Plugin{
		resource: resource, socket: socket, inv: inv, cfg: cfg, src: src,
		devices: slices.Clone(devices), changed: make(chan struct{}),
	}
}

// Resource is the resource the plugin serves.
func (p *Plugin) Resource() string { return p.resource }

// Socket is the plugin's unix socket.
func (p *Plugin) Socket() string { return p.socket }

// Devices returns a copy of the plugin's devices as it last sent them.
func (p *Plugin) Devices() []Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.devices)
}

// update replaces the devices and wakes every ListAndWatch stream when
// anything the kubelet sees changed.
func (p *Plugin) update(devices []Device) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if slices.EqualFunc(p.devices, devices, func(a, b Device) bool {
		return a.ID == b.ID && a.Healthy == b.Healthy && a.NUMANode == b.NUMANode
	}) {
		return false
	}
	p.devices = slices.Clone(devices)
	close(p.changed)
	p.changed = make(chan struct{})
	return true
}

// serve listens on the plugin's socket (replacing a stale one; mode 0600
// whatever the umask: only root, the kubelet, may connect) and serves
// until stop.
func (p *Plugin) serve(ctx context.Context) error {
	l, err := unixsock.Listen(ctx, p.socket)
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(s, p)
	p.mu.Lock()
	p.server = s
	p.done = make(chan struct{})
	done := p.done
	p.mu.Unlock()
	go func() {
		defer close(done)
		_ = s.Serve(l)
	}()
	return nil
}

// stop ends the server and removes the socket.
func (p *Plugin) stop() {
	p.mu.Lock()
	s, done := p.server, p.done
	p.server = nil
	p.mu.Unlock()
	if s == nil {
		return
	}
	s.Stop()
	<-done
	_ = os.Remove(p.socket)
}

// GetDevicePluginOptions tells the kubelet to ask for preferred
// allocations.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch sends the devices, then again on every change, until the
// stream or the server ends.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		p.mu.Lock()
		devs, changed := slices.Clone(p.devices), p.changed
		p.mu.Unlock()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: apiDevices(devs)}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

func apiDevices(devs []Device) []*pluginapi.Device {
	out := make([]*pluginapi.Device, len(devs))
	for i, d := range devs {
		h := pluginapi.Healthy
		if !d.Healthy {
			h = pluginapi.Unhealthy
		}
		out[i] = &pluginapi.Device{ID: d.ID, Health: h}
		if d.NUMANode >= 0 {
			out[i].Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(d.NUMANode)}}}
		}
	}
	return out
}

// GetPreferredAllocation chooses, for each container, the allocation size
// devices among the available ones that gpuiso's topology placement
// prefers, with every device the kubelet must include.
func (p *Plugin) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.GetContainerRequests() {
		ids, err := p.Preferred(ctx, cr.GetAvailableDeviceIDs(), cr.GetMustIncludeDeviceIDs(), int(cr.GetAllocationSize()))
		if err != nil {
			return nil, grpcError(err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Preferred is the placement GetPreferredAllocation answers: size devices
// of available, with every one of mustInclude. Whole GPUs are chosen by the
// allocator's topology policy on a scratch allocator that sees only the
// available GPUs; MIG devices (which share no links) are taken in order.
func (p *Plugin) Preferred(ctx context.Context, available, mustInclude []string, size int) ([]string, error) {
	byID := map[string]Device{}
	for _, d := range p.Devices() {
		byID[d.ID] = d
	}
	for _, id := range slices.Concat(available, mustInclude) {
		if _, ok := byID[id]; !ok {
			return nil, fmt.Errorf("preferred allocation of %s: device %q: %w", p.resource, id, ErrUnknownDevice)
		}
	}
	if size <= 0 || size > len(available) || len(mustInclude) > size {
		return nil, fmt.Errorf("preferred allocation of %s: size %d of %d available with %d required: %w",
			p.resource, size, len(available), len(mustInclude), ErrInvalidConfig)
	}
	if d := byID[available[0]]; d.TimeSlice || d.Slice {
		return preferSlices(byID, available, mustInclude, size), nil
	}
	if strings.HasPrefix(available[0], "MIG-") || p.inv == nil {
		out := slices.Clone(mustInclude)
		for _, id := range available {
			if len(out) == size {
				break
			}
			if !slices.Contains(out, id) {
				out = append(out, id)
			}
		}
		return out, nil
	}
	scratch := p.inv.Clone()
	avail := map[string]bool{}
	for _, id := range available {
		avail[id] = true
	}
	for i := range scratch.Devices {
		d := &scratch.Devices[i]
		d.Health = node.Healthy()
		if !avail[d.UUID] || d.MIGSplit() {
			d.Health = node.Unhealthy("not available")
		}
	}
	a, err := allocator.New(scratch)
	if err != nil {
		return nil, fmt.Errorf("preferred allocation of %s: %w", p.resource, err)
	}
	defer a.Close()
	al, err := a.Allocate(ctx, "preferred", allocator.Request{Count: size, Devices: mustInclude})
	if err != nil {
		return nil, fmt.Errorf("preferred allocation of %s: %w", p.resource, err)
	}
	out := make([]string, len(al.Devices))
	for i, r := range al.Devices {
		out[i] = r.UUID
	}
	return out, nil
}

// Allocate answers each container with the CDI names of its devices, the
// environment naming them, and, with Config.DeviceSpecs, their device
// nodes.
func (p *Plugin) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.GetContainerRequests() {
		c, err := p.container(ctx, cr.GetDevicesIds())
		if err != nil {
			return nil, grpcError(err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, c)
	}
	return resp, nil
}

// Container is Allocate's answer for one container given ids. A whole GPU
// or MIG device is held for its DeviceOwner first when the source is a
// Keeper (the allocator); one that another owner holds (a DRA claim
// prepared on the same allocator) is refused with ErrHeld rather than
// handed out twice. A time slice is held in the allocator for its replica
// (TimeSliceOwner) first: one refused there (its GPU held whole, or by
// memory shares) fails the container; the container gets the GPU, as
// every other time slice of it. A concurrent slice (StrategyMPS) is held
// for its replica (ConcurrentSliceOwner) and joins its GPU's MPS daemon
// (started with the GPU's first slice); the container gets the GPU, the
// daemon's pipe directory and /dev/shm as mounts, and
// CUDA_MPS_PIPE_DIRECTORY and the daemon's limits in its environment. A
// container asking for more than one concurrent slice is refused
// (ErrSliceCount). A refused container holds nothing.
func (p *Plugin) Container(ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	return p.container(context.Background(), ids)
}

func (p *Plugin) container(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	byID := map[string]Device{}
	for _, d := range p.Devices() {
		byID[d.ID] = d
	}
	refs := make([]node.DeviceRef, 0, len(ids))
	var sliced, whole []Device
	keeper, keeps := p.src.(Keeper)
	for _, id := range ids {
		d, ok := byID[id]
		if !ok {
			return nil, fmt.Errorf("allocate %s: device %q: %w", p.resource, id, ErrUnknownDevice)
		}
		if d.Slice {
			if len(ids) > 1 {
				return nil, fmt.Errorf("allocate %s: %d devices in one container: %w", p.resource, len(ids), ErrSliceCount)
			}
			return p.concurrentContainer(ctx, d)
		}
		if d.TimeSlice {
			sliced = append(sliced, d)
			if !containsRef(refs, d.Ref) {
				refs = append(refs, d.Ref)
			}
			continue
		}
		if h, ok := p.src.(Holders); ok && !keeps {
			if owners, err := h.Owners(id); err == nil && len(owners) > 0 {
				return nil, fmt.Errorf("allocate %s: device %s is held by %v: %w", p.resource, id, owners, ErrHeld)
			}
		}
		whole = append(whole, d)
		refs = append(refs, d.Ref)
	}
	// The answer first: what may fail after the holds below is only
	// those.
	names, err := cdi.Names(p.cfg.CDIKind, refs)
	if err != nil {
		return nil, fmt.Errorf("allocate %s: %w", p.resource, err)
	}
	resp := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}
	for _, n := range names {
		resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: n})
	}
	plan, err := isolator.NewPlan("device-plugin", p.inv, refs, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("allocate %s: %w", p.resource, err)
	}
	for _, kv := range plan.Env {
		k, v, _ := strings.Cut(kv, "=")
		resp.Envs[k] = v
	}
	if p.cfg.DeviceSpecs {
		for _, n := range plan.Devices {
			resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{ContainerPath: n.Path, HostPath: n.HostPath, Permissions: "rw"})
		}
	}
	var took []string
	if keeps && len(whole) > 0 {
		if took, err = p.holdDevices(ctx, keeper, whole); err != nil {
			return nil, err
		}
	}
	if len(sliced) > 0 {
		if err := p.claimSlices(ctx, sliced); err != nil {
			return nil, errors.Join(append([]error{err}, release(ctx, keeper, took)...)...)
		}
	}
	if len(took) > 0 || len(sliced) > 0 {
		p.cfg.heldChanged()
	}
	return resp, nil
}

func containsRef(refs []node.DeviceRef, r node.DeviceRef) bool {
	for _, x := range refs {
		if x.UUID == r.UUID {
			return true
		}
	}
	return false
}

// grpcError gives err the gRPC code its kind maps to.
func grpcError(err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, node.ErrNotFound), errors.Is(err, node.ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, node.ErrInsufficient), errors.Is(err, node.ErrUnavailable):
		code = codes.ResourceExhausted
	}
	return status.Error(code, err.Error())
}
