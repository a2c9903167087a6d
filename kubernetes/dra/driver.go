package dra

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
)

// DefaultDriverName is the driver's name: the domain of its attributes and
// the value a DeviceClass selects with device.driver == "gpu.gpuiso.io".
const DefaultDriverName = "gpu.gpuiso.io"

// Config configures a Driver.
type Config struct {
	// DriverName is the driver's name (default DefaultDriverName).
	DriverName string
	// CDIDir is where claims' CDI specs go (default cdi.DefaultDir).
	CDIDir string
	// StateDir holds one checkpoint file per prepared claim (required).
	StateDir string
	// Slice tunes the published devices; Slice.Shared names the GPUs
	// published as memory shares, which the allocator must have been
	// made to share (allocator.WithShared).
	Slice SliceOptions
	// MPS starts, stops and recovers the MPS control daemons of the
	// prepared shares, one per share (required with Slice.Shared).
	MPS *mps.Manager
	// Logger, when set, receives the driver's events.
	Logger *slog.Logger
	// Observer, when set, is told of every prepare and unprepare with
	// its timings (metrics).
	Observer Observer
	// NodeName is the node's name, the pool of its slice: the health
	// reports of WatchHealthStatus name it (without it the driver reports
	// no health).
	NodeName string
	// HealthResend is how often WatchHealthStatus sends the devices'
	// health again when it did not change (default DefaultHealthResend).
	HealthResend time.Duration
	// MIGDestroyer, with dynamic MIG, destroys the GPU instance a
	// preparation cut short may have left without a compute instance at
	// its placement (see MIGPlacementDestroyer); without it such an
	// instance stays.
	MIGDestroyer MIGPlacementDestroyer
	// LeaveOutUnhealthy leaves unhealthy devices out of the slice instead
	// of publishing them with a taint (Slice.TaintKey, default
	// TaintKey(DriverName)), for a cluster without device taints.
	LeaveOutUnhealthy bool
	// DeviceMetadata gives every prepared device its metadata (see
	// withMetadata), for the kubelet plugin's device metadata files
	// (kubeletplugin.EnableDeviceMetadata), which containers read at
	// /var/run/kubernetes.io/dra-device-attributes/<claim>/<request>/metadata.json.
	DeviceMetadata bool
}

// Driver prepares and unprepares resource claims for the kubelet (it is a
// kubeletplugin.DRAPlugin) and computes the node's ResourceSlice. It is
// safe for concurrent use.
type Driver struct {
	cfg   Config
	kind  string
	inv   *node.Inventory
	alloc *allocator.Allocator
	cps   checkpoints
	cdiw  cdi.Writer

	mu     sync.Mutex // held while an operation changes the node's state (see claims)
	claims claimLocks // one operation at a time on each claim
	mig    madeMIG    // MIG devices made for claims (dynamic MIG)

	health healthWaiters // WatchHealthStatus calls waiting for NotifyHealth
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// New returns a Driver for the GPUs of inv, which alloc hands out (its
// health is the slice's; its owners are the prepared claims). Dynamic MIG
// (SliceOptions.DynamicMIG) needs an allocator that makes MIG devices
// (allocator.Allocator.PlacesMIG); without one New fails with
// ErrInvalidConfig and ErrNoMIGManager rather than every such claim at
// Prepare.
func New(inv *node.Inventory, alloc *allocator.Allocator, cfg Config) (*Driver, error) {
	if inv == nil || alloc == nil {
		return nil, fmt.Errorf("DRA driver needs an inventory and an allocator: %w", ErrInvalidConfig)
	}
	if cfg.DriverName == "" {
		cfg.DriverName = DefaultDriverName
	}
	if cfg.CDIDir == "" {
		cfg.CDIDir = cdi.DefaultDir
	}
	if cfg.StateDir == "" {
		return nil, fmt.Errorf("DRA driver needs a state directory: %w", ErrInvalidConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	kind := cfg.DriverName + "/claim"
	if err := cdi.ValidateKind(kind); err != nil {
		return nil, fmt.Errorf("driver name %q: %w: %w", cfg.DriverName, ErrInvalidConfig, err)
	}
	if err := cfg.healthDefaults(); err != nil {
		return nil, err
	}
	if len(cfg.Slice.Shared) > 0 && cfg.MPS == nil {
		return nil, fmt.Errorf("shared GPUs without an MPS daemon manager: %w", ErrInvalidConfig)
	}
	for _, u := range cfg.Slice.Shared {
		if !slices.ContainsFunc(inv.Devices, func(d node.Device) bool { return d.UUID == u && !d.MIGSplit() }) {
			return nil, fmt.Errorf("shared GPU %q: not a whole GPU of the node: %w", u, ErrInvalidConfig)
		}
	}
	if err := checkDynamicMIG(inv, cfg.Slice); err != nil {
		return nil, err
	}
	if len(cfg.Slice.DynamicMIG) > 0 && !alloc.PlacesMIG() {
		return nil, fmt.Errorf("dynamic MIG GPUs %q with an allocator that cannot make MIG devices: %w: %w", cfg.Slice.DynamicMIG, ErrInvalidConfig, ErrNoMIGManager)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("DRA state directory: %w", err)
	}
	return &Driver{cfg: cfg, kind: kind, inv: inv, alloc: alloc, cps: checkpoints{dir: cfg.StateDir}, cdiw: cdi.Writer{Dir: cfg.CDIDir, NoSync: true}}, nil
}

// CDIKind is the kind of the claims' CDI specs: "<driver>/claim".
func (d *Driver) CDIKind() string { return d.kind }

// Resources is what the driver publishes for its node now: one pool, named
// after the node, of one slice holding Devices of the allocator's current
// view (unhealthy devices left out).
func (d *Driver) Resources(nodeName string) resourceslice.DriverResources {
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		nodeName: {Slices: d.preferred(d.poolSlices())},
	}}
}

// Prepared returns the uids of the claims with a checkpoint, sorted.
func (d *Driver) Prepared() ([]string, error) { return d.cps.list() }

// PrepareResourceClaims prepares each claim: see Prepare.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		devs, err := d.Prepare(ctx, c)
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs, Err: err}
	}
	return out, nil
}

// Prepare makes claim's devices of this driver ready for its pods: it
// holds them in the allocator under the claim's owner id, writes the CDI
// spec of their plan (isolator.NewPlan rendered by cdi.Render), and
// records the claim in its checkpoint, started before and completed after.
// A claim already prepared gets the recorded answer again; one whose
// preparation was cut short is rolled back first. A failure rolls back what
// this call did and leaves no checkpoint.
func (d *Driver) Prepare(ctx context.Context, claim *resourceapi.ResourceClaim) (devs []kubeletplugin.Device, err error) {
	t := startOp(OpPrepare, string(claim.UID))
	defer func() { d.endPrepare(ctx, t, claim, devs, err) }()
	defer d.claims.lock(string(claim.UID))()
	t.step(StepWait)
	uid := string(claim.UID)
	cp, ok, err := d.cps.read(uid)
	t.step(StepRead)
	if err != nil {
		return nil, fmt.Errorf("prepare claim %s: %w", uid, err)
	}
	if ok && cp.State == StatePrepareCompleted {
		// The spec lives in a directory emptied at boot (and anyone with
		// root may have changed it): it is written again when it is
		// missing or differs from what the claim's devices give now.
		t.lock(&d.mu)
		_, err := d.restore(ctx, cp)
		d.mu.Unlock()
		t.step(StepRestore)
		if err != nil {
			return nil, fmt.Errorf("prepare claim %s/%s: %w", claim.Namespace, claim.Name, err)
		}
		t.ev.Recorded = true
		return d.withMetadata(cp, cp.result()), nil
	}
	if ok {
		t.lock(&d.mu)
		err := d.rollback(ctx, cp)
		d.mu.Unlock()
		t.step(StepRollback)
		if err != nil {
			return nil, fmt.Errorf("prepare claim %s: roll back the cut-short preparation: %w", uid, err)
		}
	}
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("prepare claim %s/%s: %w", claim.Namespace, claim.Name, ErrNotAllocated)
	}
	cp = Checkpoint{UID: uid, Namespace: claim.Namespace, Name: claim.Name, State: StatePrepareStarted, Owner: ownerOf(uid)}
	byName, shares := d.byName(), d.shareNames()
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.cfg.DriverName {
			continue
		}
		if pd, ok, err := d.placementDevice(claim, r); ok {
			if err != nil {
				return nil, fmt.Errorf("prepare claim %s/%s: device %q: %w", claim.Namespace, claim.Name, r.Device, err)
			}
			cp.Devices = append(cp.Devices, pd)
			continue
		}
		pd, err := d.resultDevice(claim, r, byName, shares, &cp)
		if err != nil {
			return nil, fmt.Errorf("prepare claim %s/%s: device %q: %w", claim.Namespace, claim.Name, r.Device, err)
		}
		pd.tolerations = r.Tolerations
		cp.Devices = append(cp.Devices, pd)
	}
	if len(cp.Devices) == 0 {
		return nil, nil
	}
	if cp.Share != nil && len(cp.Devices) > 1 {
		// An owner holds one share, and a container reaches one MPS
		// daemon (at /tmp/nvidia-mps).
		return nil, fmt.Errorf("prepare claim %s/%s: %d devices of this driver with a share: %w", claim.Namespace, claim.Name, len(cp.Devices), ErrShareClaim)
	}
	if cp.Share != nil && cp.Share.daemon() && d.cfg.MPS == nil {
		return nil, fmt.Errorf("prepare claim %s/%s: %w", claim.Namespace, claim.Name, mps.ErrNoManager)
	}
	err = d.cps.write(cp)
	t.step(StepStarted)
	if err != nil {
		return nil, fmt.Errorf("prepare claim %s: %w", uid, err)
	}
	if err := d.prepare(ctx, &cp, t); err != nil {
		err = fmt.Errorf("prepare claim %s/%s: %w", claim.Namespace, claim.Name, err)
		t.lock(&d.mu)
		if rerr := d.rollback(ctx, cp); rerr != nil {
			err = errors.Join(err, fmt.Errorf("roll back: %w", rerr))
		}
		d.mu.Unlock()
		t.step(StepRollback)
		return nil, err
	}
	return d.withMetadata(cp, cp.result()), nil
}

// prepare holds cp's devices and writes their CDI spec, holding d.mu,
// then records cp completed.
func (d *Driver) prepare(ctx context.Context, cp *Checkpoint, t *opTimer) error {
	t.lock(&d.mu)
	if err := d.holdAndWrite(ctx, cp, t); err != nil {
		return err
	}
	// The claim's one CDI device carries every node and the environment
	// naming all of them; the first device of the claim names it (a
	// runtime given the same CDI device twice would apply it twice).
	cp.Devices[0].CDIDeviceIDs = []string{d.kind + "=" + cdi.AllocationDevice(cp.Owner)}
	cp.State = StatePrepareCompleted
	err := d.cps.write(*cp)
	t.step(StepCompleted)
	return err
}

// holdAndWrite holds cp's devices and writes their CDI spec; the caller
// holds d.mu, which it unlocks.
func (d *Driver) holdAndWrite(ctx context.Context, cp *Checkpoint, t *opTimer) error {
	defer d.mu.Unlock()
	al, err := d.hold(ctx, cp)
	t.step(StepAllocate)
	if err != nil {
		return err
	}
	_, err = d.writeSpec(ctx, cp.Owner, al)
	t.step(StepSpec)
	if err != nil {
		return err
	}
	return nil
}

// writeSpec writes owner's CDI spec for al: the isolator.Plan of its
// devices rendered by cdi.Render. A memory share's plan has its MPS
// daemon, started here (or found running: Start is idempotent, and starts
// a dead one again in its directories), and the share's limits in its
// environment; a concurrent slice's has its GPU's daemon, shared by its
// slices (mps.Manager.StartShare records the slice as one of its
// tenants), and a time slice's has none. The writer leaves a file that
// already holds these bytes untouched; Changed says whether it wrote.
func (d *Driver) writeSpec(ctx context.Context, owner string, al allocator.Allocation) (cdi.Result, error) {
	dm, err := d.cfg.MPS.StartShare(ctx, al) // nil for all but a memory share
	if err != nil {
		return cdi.Result{}, err
	}
	plan, err := isolator.NewPlan(owner, d.planInventory(al), al.Devices, nil, nil, isolator.WithShare(dm))
	if err != nil {
		return cdi.Result{}, err
	}
	spec, err := cdi.Render(d.kind, plan)
	if err != nil {
		return cdi.Result{}, err
	}
	return d.cdiw.WriteAllocation(ctx, owner, spec)
}

// restore makes a completed claim's CDI spec what its checkpoint gives:
// the allocator holds exactly the recorded devices under the claim's owner
// (allocator.Claim: nothing changes when it does; a hold the allocator
// lost is taken again, or refused when another owner has a device now),
// and their spec is written when the file is missing or differs. It
// reports whether it wrote the file. The caller holds d.mu.
func (d *Driver) restore(ctx context.Context, cp Checkpoint) (bool, error) {
	al, err := d.reclaim(ctx, cp)
	if err != nil {
		return false, fmt.Errorf("hold the prepared devices again: %w", err)
	}
	res, err := d.writeSpec(ctx, cp.Owner, al)
	if err != nil {
		return false, fmt.Errorf("write the CDI spec again: %w", err)
	}
	return res.Changed, nil
}

// Restore writes the CDI spec of every prepared claim again where it is
// missing or differs from what the claim's devices give now, and returns
// the uids of the claims whose spec it wrote, sorted. The specs live in a
// directory the node empties at boot (/var/run/cdi) while the checkpoints
// survive, and after a reboot the kubelet may start a prepared claim's
// containers again before it asks to prepare the claim, or without asking:
// call Restore when the plugin starts, before it registers with the
// kubelet. Prepare does the same for the one claim it is asked about.
//
// A claim cut short (PrepareStarted) is left for its next Prepare, which
// rolls it back. A corrupt checkpoint (ErrCorruptCheckpoint) is reported
// and left as it is, and a claim whose devices cannot be held or whose
// spec cannot be written is reported; the errors are joined and every
// other claim is still restored.
func (d *Driver) Restore(ctx context.Context) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	uids, err := d.cps.list()
	if err != nil {
		return nil, fmt.Errorf("restore prepared claims: %w", err)
	}
	var written []string
	var errs []error
	for _, uid := range uids {
		if err := ctx.Err(); err != nil {
			errs = append(errs, fmt.Errorf("restore prepared claims: %w", err))
			break
		}
		cp, ok, err := d.cps.read(uid)
		if err != nil {
			errs = append(errs, fmt.Errorf("restore claim %s: %w", uid, err))
			continue
		}
		if !ok || cp.State != StatePrepareCompleted {
			continue
		}
		changed, err := d.restore(ctx, cp)
		if err != nil {
			errs = append(errs, fmt.Errorf("restore claim %s: %w", uid, err))
			continue
		}
		if changed {
			written = append(written, uid)
			d.cfg.Logger.Info("wrote a prepared claim's CDI spec again", "claim", cp.Namespace+"/"+cp.Name, "uid", uid)
		}
	}
	if err := d.restoreMIG(ctx, uids); err != nil {
		errs = append(errs, fmt.Errorf("restore prepared claims: %w", err))
	}
	if d.cfg.MPS != nil && ctx.Err() == nil {
		// Daemons no checkpoint explains: a claim unprepared while the
		// daemon's stop failed, or a directory meddled with.
		keep := mps.Keep{Recorded: func(owner string) bool {
			uid, ok := claimOf(owner)
			return ok && d.cps.exists(uid)
		}}
		stopped, err := d.cfg.MPS.Sweep(ctx, keep.Keeps)
		if err != nil {
			errs = append(errs, fmt.Errorf("restore prepared claims: %w", err))
		}
		if len(stopped) > 0 {
			d.cfg.Logger.Info("stopped MPS daemons of no prepared claim", "owners", stopped)
		}
	}
	return written, errors.Join(errs...)
}

// rollback undoes whatever of cp's preparation happened: the allocator's
// hold (and the dynamic MIG device made for it, even one the allocator
// had not recorded yet: takeOverMIG), the CDI spec, the checkpoint. Each
// step tolerates its part being absent. The caller holds d.mu.
func (d *Driver) rollback(ctx context.Context, cp Checkpoint) error {
	if cp.Share != nil && cp.Share.daemon() {
		// The daemon goes before the share: a daemon that cannot be
		// stopped keeps its share held and its checkpoint, for the next
		// try. A concurrent slice's Stop drops it from its GPU's daemon,
		// which stops with the GPU's last slice.
		if d.cfg.MPS == nil {
			return fmt.Errorf("stop the share's MPS daemon: %w", mps.ErrNoManager)
		}
		if err := d.cfg.MPS.Stop(ctx, cp.Owner); err != nil {
			return err
		}
	}
	var errs []error
	if slices.ContainsFunc(cp.Devices, func(pd PreparedDevice) bool { return pd.MIG != nil }) {
		// A dynamic MIG device made and not yet recorded by the
		// allocator is held now, so that Release destroys it.
		if err := d.takeOverMIG(ctx, cp); err != nil {
			return err
		}
	}
	if err := d.alloc.Release(ctx, cp.Owner); err != nil && !errors.Is(err, allocator.ErrUnknownOwner) {
		errs = append(errs, err)
	}
	if err := d.cdiw.RemoveAllocation(ctx, d.kind, cp.Owner); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		if err := d.cps.remove(cp.UID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (cp Checkpoint) result() []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, len(cp.Devices))
	for i, pd := range cp.Devices {
		out[i] = kubeletplugin.Device{Requests: pd.Requests, PoolName: pd.Pool, DeviceName: pd.Device, CDIDeviceIDs: pd.CDIDeviceIDs}
		if pd.ShareID != "" {
			out[i].ShareID = ptr.To(types.UID(pd.ShareID))
		}
	}
	return out
}

// shareNames maps the name of every whole GPU's share device
// (ShareDeviceName) to its UUID, whether the GPU is shared now or not: a
// claim allocated a share before the driver's configuration changed is
// prepared as one (the allocator refuses a GPU it does not share).
func (d *Driver) shareNames() map[string]string {
	out := map[string]string{}
	for _, dev := range d.inv.Devices {
		if !dev.MIGSplit() && dev.UUID != "" {
			out[ShareDeviceName(dev)] = dev.UUID
		}
	}
	return out
}

// share is the allocator's share of p.
func (p PreparedShare) share() *allocator.Share {
	switch p.Mode {
	case allocator.ShareTime:
		return &allocator.Share{Mode: allocator.ShareTime}
	case allocator.ShareSlice:
		return &allocator.Share{Mode: allocator.ShareSlice, Slices: p.Slices}
	}
	return &allocator.Share{Mode: allocator.ShareMemory, MemoryBytes: p.MemoryBytes, ComputePercent: p.ComputePercent}
}

// byName maps the slice's device names to UUIDs, for every device of the
// node whatever its health.
func (d *Driver) byName() map[string]string {
	out := map[string]string{}
	for _, dev := range d.inv.Devices {
		if !dev.MIGSplit() {
			out[DeviceName(dev)] = dev.UUID
			continue
		}
		for _, m := range dev.MIGDevices {
			out[MIGDeviceName(m)] = m.UUID
		}
	}
	return out
}

// UnprepareResourceClaims unprepares each claim: see Unprepare.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = d.Unprepare(ctx, string(c.UID))
	}
	return out, nil
}

// Unprepare releases a claim's devices, removes its CDI spec and then its
// checkpoint. A claim with no checkpoint (never prepared here, or already
// unprepared) is not an error: the kubelet may ask again after a restart.
func (d *Driver) Unprepare(ctx context.Context, uid string) (err error) {
	t := startOp(OpUnprepare, uid)
	msg := ""
	defer func() { d.end(ctx, t, err, msg) }()
	defer d.claims.lock(uid)()
	t.step(StepWait)
	cp, ok, err := d.cps.read(uid)
	t.step(StepRead)
	if err != nil {
		return fmt.Errorf("unprepare claim %s: %w", uid, err)
	}
	if !ok {
		return nil
	}
	t.lock(&d.mu)
	err = d.rollback(ctx, cp)
	d.mu.Unlock()
	t.step(StepRollback)
	if err != nil {
		return fmt.Errorf("unprepare claim %s: %w", uid, err)
	}
	msg = "unprepared claim"
	return nil
}

// HandleError logs errors of the helper's background work.
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	d.cfg.Logger.Warn(msg, "err", err)
}
