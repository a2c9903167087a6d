package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// Defaults of the time slices' Config fields.
const (
	DefaultSharedResourceName = "nvidia.com/gpu.shared"
	DefaultPodResources       = "/var/lib/kubelet/pod-resources/kubelet.sock"
	// DefaultTimeSliceGrace is how long Reconcile leaves a time slice
	// that Allocate just took, whatever the kubelet says: the kubelet
	// records a container's devices only after Allocate answers (at
	// once: the grace is ample).
	DefaultTimeSliceGrace = 10 * time.Second
)

// TimeSlicer is what a Source must also be to serve time slices: an
// *allocator.Allocator, which holds each replica in use as a time slice
// (allocator.ShareTime) and counts them.
type TimeSlicer interface {
	Claim(ctx context.Context, owner string, devices []node.DeviceRef, opts ...allocator.ClaimOption) (allocator.Allocation, error)
	Allocations() []allocator.Allocation
	Release(ctx context.Context, owner string) error
}

// The allocator is a TimeSlicer: a change of its method set that breaks
// this fails the build, where a type assertion would refuse time slices
// only at run time.
var _ TimeSlicer = (*allocator.Allocator)(nil)

// TimeSliceID is the kubelet's name of replica k of the GPU uuid:
// "<uuid>::<k>".
func TimeSliceID(uuid string, k int) string { return uuid + "::" + strconv.Itoa(k) }

// TimeSliceOwner is the allocator's owner of replica k of the GPU uuid:
// "timeslice-<uuid>-<k>".
func TimeSliceOwner(uuid string, k int) string { return timeSlicePrefix + uuid + "-" + strconv.Itoa(k) }

const timeSlicePrefix = "timeslice-"

// timeSliceOfOwner is the replica an owner of TimeSliceOwner's names.
func timeSliceOfOwner(owner string) (string, bool) { return replicaOfOwner(timeSlicePrefix, owner) }

// TimeSlices are the replicas of the GPUs of devs that shared names (by
// UUID): replicas devices per GPU, each a time slice of it, named by
// TimeSliceID, with the GPU's health and NUMA node. GPUs split by MIG, or
// without a UUID, have none. They are in inventory order, replicas in
// order.
func TimeSlices(devs []node.Device, shared []string, replicas int) []Device {
	var out []Device
	for p, d := range devs {
		if d.MIGSplit() || d.UUID == "" || !slices.Contains(shared, d.UUID) {
			continue
		}
		for k := range replicas {
			out = append(out, Device{ID: TimeSliceID(d.UUID, k), Healthy: d.Health.Healthy, NUMANode: d.NUMANode,
				Ref: d.Ref(), Position: p, TimeSlice: true, Replica: k})
		}
	}
	return out
}

// resources are the resources the manager serves for devs: Resources,
// with the shared GPUs as time slices (or, with StrategyMPS, concurrent
// slices) under SharedResourceName instead of whole.
func (c *Config) resources(devs []node.Device) (map[string][]Device, error) {
	res, err := Resources(c.ResourceName, devs)
	if err != nil || len(c.Shared) == 0 {
		return res, err
	}
	whole := slices.DeleteFunc(res[c.ResourceName], func(d Device) bool { return slices.Contains(c.Shared, d.ID) })
	if len(whole) == 0 {
		delete(res, c.ResourceName)
	} else {
		res[c.ResourceName] = whole
	}
	replicas := TimeSlices
	if c.Strategy == StrategyMPS {
		replicas = ConcurrentSlices
	}
	if ts := replicas(devs, c.Shared, c.Replicas); len(ts) > 0 {
		res[c.SharedResourceName] = ts
	}
	return res, nil
}

// sliceBook remembers when Allocate took each time slice, for Reconcile's
// grace.
type sliceBook struct {
	mu    sync.Mutex
	taken map[string]time.Time
}

func (b *sliceBook) take(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.taken == nil {
		b.taken = map[string]time.Time{}
	}
	b.taken[id] = time.Now()
}

// recent reports whether id was taken within grace, and forgets what is
// older.
func (b *sliceBook) recent(id string, grace time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.taken[id]
	if ok && time.Since(t) < grace {
		return true
	}
	delete(b.taken, id)
	return false
}

// claimSlices holds each time slice of devs for its replica's owner
// (allocator.Claim with AsShare: a replica held already, by a pod that ended, is
// kept as it is). On error it gives back what it took.
func (p *Plugin) claimSlices(ctx context.Context, devs []Device) error {
	ts, ok := p.src.(TimeSlicer)
	if !ok {
		return fmt.Errorf("time slices of %s: the source holds none: %w", p.resource, ErrInvalidConfig)
	}
	var took []string
	for _, d := range devs {
		owner := TimeSliceOwner(d.Ref.UUID, d.Replica)
		if _, err := ts.Claim(ctx, owner, []node.DeviceRef{d.Ref}, allocator.AsShare(allocator.Share{Mode: allocator.ShareTime})); err != nil {
			return errors.Join(append([]error{fmt.Errorf("allocate %s: time slice %s: %w", p.resource, d.ID, err)}, release(ctx, ts, took)...)...)
		}
		took = append(took, owner)
		p.book.take(d.ID)
	}
	return nil
}

// Reconcile gives back the devices and time slices that no pod uses any
// more: the device-plugin API tells a plugin when the kubelet hands a
// device out, never when its pod ends, so the manager asks the kubelet's
// pod-resources service (Config.PodResources) which devices of its
// resources its pods hold, and releases every other one it holds in the
// allocator (DeviceOwner, TimeSliceOwner, ConcurrentSliceOwner), except
// those Allocate took within Config.TimeSliceGrace. A concurrent slice
// leaves its GPU's MPS daemon first (Config.MPS: the daemon stops with
// the GPU's last slice); one whose daemon cannot be left stays held, in
// the error, for the next round. It returns the owners released, sorted.
// When the kubelet cannot be asked, it releases nothing.
func (m *Manager) Reconcile(ctx context.Context) ([]string, error) {
	k, kok := m.src.(Keeper)
	ts, tok := m.src.(TimeSlicer)
	if !kok && !tok {
		return nil, nil
	}
	var allocs []allocator.Allocation
	if kok {
		allocs = k.Allocations()
	} else {
		allocs = ts.Allocations()
	}
	var ours []allocator.Allocation
	for _, al := range allocs {
		if _, ok := m.ownedDevice(al); ok {
			ours = append(ours, al)
		}
	}
	if len(ours) == 0 {
		return nil, nil // nothing to give back: the kubelet need not be asked
	}
	inUse, err := devicesInUse(ctx, m.cfg.PodResources, m.resourceNames())
	if err != nil {
		return nil, fmt.Errorf("reconcile the devices held for pods: %w", err)
	}
	var released []string
	var errs []error
	for _, al := range ours {
		id, _ := m.ownedDevice(al)
		if inUse[id] || m.book.recent(id, m.cfg.TimeSliceGrace) {
			continue
		}
		if al.Share != nil && al.Share.Mode == allocator.ShareSlice {
			// The daemon goes before the slice: a daemon that cannot
			// leave keeps its slice held, for the next round.
			if err := m.cfg.MPS.Stop(ctx, al.Owner); err != nil {
				errs = append(errs, fmt.Errorf("release %s: %w", al.Owner, err))
				continue
			}
		}
		var err error
		if kok {
			err = k.Release(ctx, al.Owner)
		} else {
			err = ts.Release(ctx, al.Owner)
		}
		if err != nil && !errors.Is(err, allocator.ErrUnknownOwner) {
			errs = append(errs, err)
			continue
		}
		released = append(released, al.Owner)
	}
	slices.Sort(released)
	if len(released) > 0 {
		m.cfg.Logger.Info("released devices no pod uses", "owners", released)
		m.cfg.heldChanged()
	}
	return released, errors.Join(errs...)
}

// ownedDevice is the kubelet's id of the device, time slice or
// concurrent slice al holds for a pod of the plugin's (DeviceOwner,
// TimeSliceOwner, ConcurrentSliceOwner); ok is false for any other
// allocation (a DRA claim's).
func (m *Manager) ownedDevice(al allocator.Allocation) (string, bool) {
	if id, ok := replicaOfOwner(concurrentPrefix, al.Owner); ok && al.Share != nil && al.Share.Mode == allocator.ShareSlice {
		// Without the daemons of slices, a slice is left alone: giving
		// it back would leave its daemon running.
		return id, m.cfg.MPS != nil
	}
	if id, ok := timeSliceOfOwner(al.Owner); ok && al.Share != nil && al.Share.Mode == allocator.ShareTime {
		return id, true
	}
	if id, ok := deviceOfOwner(al.Owner); ok && al.Share == nil {
		return id, true
	}
	return "", false
}

// devicesInUse asks the kubelet's pod-resources service at socket which
// devices of resources its pods' containers hold.
func devicesInUse(ctx context.Context, socket string, resources map[string]bool) (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("pod resources at %s: %w: %w", socket, errNoKubelet, err)
	}
	defer conn.Close()
	resp, err := podresourcesapi.NewPodResourcesListerClient(conn).List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("pod resources at %s: %w: %w", socket, errNoKubelet, err)
	}
	out := map[string]bool{}
	for _, pr := range resp.GetPodResources() {
		for _, c := range pr.GetContainers() {
			for _, d := range c.GetDevices() {
				if resources[d.GetResourceName()] {
					for _, id := range d.GetDeviceIds() {
						out[id] = true
					}
				}
			}
		}
	}
	return out, nil
}

// preferSlices chooses size replicas of available, with every one of
// mustInclude: first those, then the replicas of the GPUs with the fewest
// replicas available (the busiest), packing time slices onto GPUs already
// sliced.
func preferSlices(byID map[string]Device, available, mustInclude []string, size int) []string {
	free := map[string]int{}
	for _, id := range available {
		free[byID[id].Ref.UUID]++
	}
	rest := slices.Clone(available)
	slices.SortStableFunc(rest, func(a, b string) int { return free[byID[a].Ref.UUID] - free[byID[b].Ref.UUID] })
	out := slices.Clone(mustInclude)
	for _, id := range rest {
		if len(out) == size {
			break
		}
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}
