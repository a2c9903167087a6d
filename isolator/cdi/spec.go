package cdi

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

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
// volume.ContainerPath, with the PATH and LD_LIBRARY_PATH that
// v.Injection gives an image that sets neither.
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
// GPU named by its index and another by its UUID, each giving the GPU's
// node with its own numbers and NVIDIA_VISIBLE_DEVICES=<uuid>; the device
// AllDevices with every one of them; and, common to all of them, the
// driver's control nodes (nvidiactl, nvidia-uvm, nvidia-uvm-tools, as
// present in inv) and the driver volume when WithVolume gives one. A GPU
// that is unhealthy, or whose device node or UUID is unknown, is left out.
// The spec's version is the lowest CDI version that expresses it.
//
// New reads inv only; the spec shares nothing with it.
func New(inv *node.Inventory, opts ...Option) (*specs.Spec, error) {
	c := config{kind: DefaultKind}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, fmt.Errorf("CDI spec: %w", err)
		}
	}
	if inv == nil {
		return nil, fmt.Errorf("CDI spec %s: %w: nil inventory", c.kind, ErrNoDevices)
	}
	spec := &specs.Spec{Kind: c.kind}
	var all specs.ContainerEdits
	var uuids []string
	for _, d := range inv.Devices {
		if !usable(d) {
			continue
		}
		if d.MIGSplit() {
			// A split GPU is handed out by instance, never whole.
			for _, m := range migDevices(d) {
				spec.Devices = append(spec.Devices, m)
				all.DeviceNodes = append(all.DeviceNodes, m.ContainerEdits.DeviceNodes...)
			}
			for _, m := range d.MIGDevices {
				if migUsable(d, m) {
					uuids = append(uuids, m.UUID)
				}
			}
			continue
		}
		edits := gpuEdits(d)
		spec.Devices = append(spec.Devices,
			specs.Device{Name: strconv.Itoa(d.Index), ContainerEdits: edits},
			specs.Device{Name: d.UUID, ContainerEdits: gpuEdits(d)})
		all.DeviceNodes = append(all.DeviceNodes, edits.DeviceNodes...)
		uuids = append(uuids, d.UUID)
	}
	if len(uuids) == 0 {
		return nil, fmt.Errorf("CDI spec %s: %w", c.kind, ErrNoDevices)
	}
	all.DeviceNodes = cloneNodes(all.DeviceNodes)
	all.Env = []string{isolator.EnvVisibleDevices + "=" + strings.Join(uuids, ",")}
	spec.Devices = append(spec.Devices, specs.Device{Name: AllDevices, ContainerEdits: all})

	for _, cd := range inv.ControlDevices {
		if cd.Name == node.NVIDIAModeset || cd.Path == "" {
			continue // modeset is for the display capability only, as in isolator.NewPlan
		}
		spec.ContainerEdits.DeviceNodes = append(spec.ContainerEdits.DeviceNodes,
			deviceNode(cd.Name, node.DeviceNode{Path: cd.Path, Major: cd.Major, Minor: cd.Minor}))
	}
	if v := c.volume; v != nil {
		inj := v.Injection(nil)
		spec.ContainerEdits.Mounts = []*specs.Mount{{
			HostPath:      inj.Mount.Source,
			ContainerPath: inj.Mount.Destination,
			Type:          inj.Mount.Type,
			Options:       slices.Clone(inj.Mount.Options),
		}}
		spec.ContainerEdits.Env = slices.Clone(inj.Env)
	}

	version, err := specs.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("CDI spec %s: %w", c.kind, err)
	}
	spec.Version = version
	return spec, nil
}

// usable reports whether d goes into a spec.
func usable(d node.Device) bool {
	return d.Health.Healthy && d.Node.Path != "" && d.UUID != "" && d.Index >= 0
}

// gpuEdits are what a container gets of GPU d.
func gpuEdits(d node.Device) specs.ContainerEdits {
	return specs.ContainerEdits{
		DeviceNodes: []*specs.DeviceNode{deviceNode(filepath.Base(d.Node.Path), d.Node)},
		Env:         []string{isolator.EnvVisibleDevices + "=" + d.UUID},
	}
}

// migDevices are the devices of GPU d's healthy MIG instances, each named
// "<index>:<gi>:<ci>" and by its "MIG-..." UUID, giving the parent's node
// plus the caps nodes of its GPU and compute instances, and naming the MIG
// UUID in the environment. Nothing of the sibling instances is in them.
func migDevices(d node.Device) []specs.Device {
	var out []specs.Device
	for _, m := range d.MIGDevices {
		if !migUsable(d, m) {
			continue
		}
		edits := func() specs.ContainerEdits {
			return specs.ContainerEdits{
				DeviceNodes: []*specs.DeviceNode{
					deviceNode(filepath.Base(d.Node.Path), d.Node),
					deviceNode(filepath.Join(node.NVIDIACapsDir, filepath.Base(m.GIAccess.Path)), m.GIAccess),
					deviceNode(filepath.Join(node.NVIDIACapsDir, filepath.Base(m.CIAccess.Path)), m.CIAccess),
				},
				Env: []string{isolator.EnvVisibleDevices + "=" + m.UUID},
			}
		}
		out = append(out,
			specs.Device{Name: fmt.Sprintf("%d:%d:%d", d.Index, m.GI, m.CI), ContainerEdits: edits()},
			specs.Device{Name: m.UUID, ContainerEdits: edits()})
	}
	return out
}

// migUsable reports whether MIG device m of GPU d goes into a spec: both
// healthy, with its caps nodes known.
func migUsable(d node.Device, m node.MIGDevice) bool {
	return m.Health.Healthy && m.UUID != "" && m.GIAccess.Path != "" && m.CIAccess.Path != ""
}

// deviceNode is the node n of the host at /dev/<name> in the container.
func deviceNode(name string, n node.DeviceNode) *specs.DeviceNode {
	return &specs.DeviceNode{
		Path:        filepath.Join(isolator.ContainerDevRoot, name),
		HostPath:    n.Path,
		Type:        "c",
		Major:       int64(n.Major),
		Minor:       int64(n.Minor),
		Permissions: DevicePermissions,
	}
}

func cloneNodes(nodes []*specs.DeviceNode) []*specs.DeviceNode {
	out := make([]*specs.DeviceNode, len(nodes))
	for i, n := range nodes {
		c := *n
		out[i] = &c
	}
	return out
}
