package cdi

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/volume"
)

// DefaultKind is the device kind ("vendor/class") of the specs gpuiso
// writes unless told otherwise, the one NVIDIA's own tools use.
const DefaultKind = "nvidia.com/gpu"

// AllDevices is the name of the device that stands for every GPU of a spec.
const AllDevices = "all"

// DevicePermissions are the cgroup permissions every device node gets.
const DevicePermissions = "rwm"

// Option configures New.
type Option func(*config) error

type config struct {
	kind   string
	volume *volume.Volume
}

// WithKind sets the spec's kind, "vendor/class" (default DefaultKind).
// Several kinds let several agents, or tests, share one spec directory.
func WithKind(kind string) Option {
	return func(c *config) error {
		if err := ValidateKind(kind); err != nil {
			return err
		}
		c.kind = kind
		return nil
	}
}

// WithVolume puts the driver volume v into every container that gets a
// device of the spec: mounted read-only, nosuid, nodev at
// volume.ContainerPath. The spec sets no PATH or LD_LIBRARY_PATH: CDI can
// only replace a variable, which would take the image's own directories
// away (see isolator.IsPathList).
func WithVolume(v *volume.Volume) Option {
	return func(c *config) error {
		if v == nil || v.Path == "" || !filepath.IsAbs(v.Path) {
			return fmt.Errorf("CDI spec volume: %w: no absolute volume path", ErrInvalidSpec)
		}
		c.volume = v
		return nil
	}
}

// ValidateKind checks that kind is "vendor/class" with names CDI accepts.
func ValidateKind(kind string) error {
	vendor, class := parser.ParseQualifier(kind)
	if vendor == "" || class == "" || vendor+"/"+class != kind {
		return &KindError{Kind: kind, Reason: `not "vendor/class"`}
	}
	if err := parser.ValidateVendorName(vendor); err != nil {
		return &KindError{Kind: kind, Reason: err.Error()}
	}
	if err := parser.ValidateClassName(class); err != nil {
		return &KindError{Kind: kind, Reason: err.Error()}
	}
	return nil
}

// New returns the CDI spec of the node inv describes: a device per healthy
// GPU named by its index and another by its UUID, each holding the nodes
// of that one GPU as isolator.GPUNodes gives them (the nodes a plan of that
// GPU holds); the same for each healthy MIG device of a split GPU, named
// "<index>:<gi>:<ci>" and by its UUID; the device AllDevices with every
// one of those nodes and the visible-device variables naming every device;
// and, common to all of them, the driver's control nodes (nvidiactl,
// nvidia-uvm, nvidia-uvm-tools, as present in inv) and the driver volume
// when WithVolume gives one. A GPU's device sets no environment: CDI
// merges devices' variables by name, so a container given two would see
// one GPU's; the environment of an allocation comes with its own device
// (see Render). A GPU that is unhealthy, or whose device node or UUID is
// unknown, is left out. The spec's version is the lowest CDI version that
// expresses it.
//
// New reads inv only; the spec shares nothing with it.
func New(inv *node.Inventory, opts ...Option) (*specs.Spec, error) {
	c := config{kind: DefaultKind}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("CDI spec: nil option: %w", node.ErrInvalid)
		}
		if err := o(&c); err != nil {
			return nil, fmt.Errorf("CDI spec: %w", err)
		}
	}
	if inv == nil {
		return nil, fmt.Errorf("CDI spec %s: %w: nil inventory", c.kind, ErrNoDevices)
	}
	spec := &specs.Spec{Kind: c.kind}
	var all []isolator.DeviceNode
	var uuids []string
	add := func(ref node.DeviceRef, names ...string) {
		nodes := isolator.GPUNodes(ref)
		for _, name := range names {
			spec.Devices = append(spec.Devices, specs.Device{Name: name, ContainerEdits: Edits(nodes, nil, nil)})
		}
		for _, n := range nodes {
			if !slices.Contains(all, n) {
				all = append(all, n)
			}
		}
		uuids = append(uuids, ref.UUID)
	}
	for _, d := range inv.Devices {
		if !usable(d) {
			continue
		}
		if d.MIGSplit() {
			// A split GPU is handed out by instance, never whole.
			for _, m := range d.MIGDevices {
				if migUsable(d, m) {
					add(d.MIGRef(m), fmt.Sprintf("%d:%d:%d", d.Index, m.GI, m.CI), m.UUID)
				}
			}
			continue
		}
		add(d.Ref(), strconv.Itoa(d.Index), d.UUID)
	}
	if len(uuids) == 0 {
		return nil, fmt.Errorf("CDI spec %s: %w", c.kind, ErrNoDevices)
	}
	visible := strings.Join(uuids, ",")
	spec.Devices = append(spec.Devices, specs.Device{Name: AllDevices, ContainerEdits: Edits(all, nil,
		[]string{isolator.EnvVisibleDevices + "=" + visible, isolator.EnvCUDAVisibleDevices + "=" + visible})})

	var control []isolator.DeviceNode
	for _, cd := range inv.ControlDevices {
		if cd.Name == node.NVIDIAModeset || cd.Path == "" {
			continue // modeset is for the display capability only, as in isolator.NewPlan
		}
		control = append(control, isolator.DeviceNode{Path: filepath.Join(isolator.ContainerDevRoot, cd.Name), HostPath: cd.Path, Major: cd.Major, Minor: cd.Minor})
	}
	var mounts []ocispecs.Mount
	if v := c.volume; v != nil {
		m := v.Injection(nil).Mount
		mounts = []ocispecs.Mount{{Source: m.Source, Destination: m.Destination, Type: m.Type, Options: m.Options}}
	}
	spec.ContainerEdits = Edits(control, mounts, nil)
	return finish(spec)
}

// AllocationDevice is the name of the device that stands for owner's
// allocation in the spec Render gives: "alloc-<owner>".
func AllocationDevice(owner string) string { return "alloc-" + owner }

// Render returns plan as a CDI spec of kind: one device, named
// AllocationDevice(plan.Owner), whose edits are the plan's device nodes,
// mounts and environment (PATH-like variables left out, see Edits). Given
// that one device, a CDI runtime creates the container the plan
// describes, whatever the other devices of kind: its visible-device
// variables name every device of the allocation. A plan without GPUs
// renders too (its control nodes and NVIDIA_VISIBLE_DEVICES=void).
func Render(kind string, plan *isolator.Plan) (*specs.Spec, error) {
	if err := ValidateKind(kind); err != nil {
		return nil, fmt.Errorf("CDI spec: %w", err)
	}
	if plan == nil {
		return nil, fmt.Errorf("CDI spec %s: %w: nil plan", kind, ErrInvalidSpec)
	}
	if err := node.ValidateOwner(plan.Owner); err != nil {
		return nil, fmt.Errorf("CDI spec %s: %w", kind, err)
	}
	spec := &specs.Spec{Kind: kind, Devices: []specs.Device{{
		Name:           AllocationDevice(plan.Owner),
		ContainerEdits: Edits(plan.Devices, plan.Mounts, plan.Env),
	}}}
	return finish(spec)
}

// finish sets the spec's version: the lowest that expresses it.
func finish(spec *specs.Spec) (*specs.Spec, error) {
	version, err := specs.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("CDI spec %s: %w", spec.Kind, err)
	}
	spec.Version = version
	return spec, nil
}

// Edits is the CDI form of what a plan gives a container: the device
// nodes (bound from their host paths, rwm), the mounts, and the
// environment without the PATH-like variables (isolator.IsPathList): CDI
// can only set a variable, and setting one of those would replace the
// image's directories instead of adding to them.
func Edits(devs []isolator.DeviceNode, mounts []ocispecs.Mount, env []string) specs.ContainerEdits {
	var e specs.ContainerEdits
	for _, d := range devs {
		e.DeviceNodes = append(e.DeviceNodes, &specs.DeviceNode{
			Path:        d.Path,
			HostPath:    d.HostPath,
			Type:        "c",
			Major:       int64(d.Major),
			Minor:       int64(d.Minor),
			Permissions: DevicePermissions,
		})
	}
	for _, m := range mounts {
		e.Mounts = append(e.Mounts, &specs.Mount{HostPath: m.Source, ContainerPath: m.Destination, Type: m.Type, Options: slices.Clone(m.Options)})
	}
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); !isolator.IsPathList(k) {
			e.Env = append(e.Env, kv)
		}
	}
	return e
}

// usable reports whether d goes into a spec.
func usable(d node.Device) bool {
	return d.Health.Healthy && d.Node.Path != "" && d.UUID != "" && d.Index >= 0
}

// migUsable reports whether MIG device m of GPU d goes into a spec: both
// healthy, with its caps nodes known.
func migUsable(d node.Device, m node.MIGDevice) bool {
	return m.Health.Healthy && m.UUID != "" && m.GIAccess.Path != "" && m.CIAccess.Path != ""
}
