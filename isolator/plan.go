package isolator

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/node"
)

// ContainerDevRoot is where device nodes appear inside a container.
const ContainerDevRoot = "/dev"

// Plan is everything a container must get for its GPUs, as plain data: the
// back ends apply it (cgroup rules, a private /dev, Docker's host config, an
// OCI spec) and never decide anything themselves.
type Plan struct {
	// Owner is the container's id.
	Owner string `json:"owner"`
	// GPUs are the devices the container owns.
	GPUs []node.DeviceRef `json:"gpus"`
	// Rules is the container's device allow list; everything else is denied.
	Rules []Rule `json:"-"`
	// Devices are the nodes the container's /dev must hold beyond the
	// runtime's defaults: the control devices, then its GPUs.
	Devices []DeviceNode `json:"devices"`
	// Mounts are bind mounts into the container, such as the driver volume.
	Mounts []specs.Mount `json:"mounts,omitempty"`
	// Env are "KEY=value" settings the container's environment must have.
	Env []string `json:"env"`
	// CPUs and Mems, when set, pin the container to these CPUs and memory
	// nodes (the kernel's list format, "0-3,8"): those local to its GPUs
	// (see WithCPUAffinity). Empty means no pinning: the container has
	// what its cgroup parent has.
	CPUs string `json:"cpus,omitempty"`
	Mems string `json:"mems,omitempty"`
	// MPS is the MPS control daemon of a memory share (WithShare), or nil.
	MPS *MPS `json:"mps,omitempty"`
}

// DeviceNode is a device node a container gets: Path inside the container,
// bound from HostPath (under the host's dev root).
type DeviceNode struct {
	Path     string `json:"path"`
	HostPath string `json:"hostPath"`
	Major    uint32 `json:"major"`
	Minor    uint32 `json:"minor"`
}

// Environment variables naming a container's GPUs (their UUIDs).
const (
	EnvVisibleDevices     = "NVIDIA_VISIBLE_DEVICES"
	EnvCUDAVisibleDevices = "CUDA_VISIBLE_DEVICES"
)

// NewPlan computes what owner's container must get to use gpus, the
// devices the allocator handed out (whole GPUs and MIG devices, each with
// its nodes as discovery found them on the node inv describes), plus the
// given mounts and environment (for instance the driver volume's). Each
// device node is bound from the path the node model holds, so the plan
// needs no dev root; the device rules are derived from the nodes. The
// GPUs must be devices of inv with known nodes. The plan's Env names them
// (NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES: "void" and "" for none),
// then carries env; a device variable in env (an earlier plan's Env, for a
// plan made again) is replaced by this plan's. Options add to the plan:
// WithCPUAffinity pins it to the CPUs and memory local to its GPUs;
// WithShare gives a memory share's container its MPS daemon's directories
// and the share's client limits, the one place they are made.
func NewPlan(owner string, inv *node.Inventory, gpus []node.DeviceRef, mounts []specs.Mount, env []string, opts ...PlanOption) (*Plan, error) {
	if err := node.ValidateOwner(owner); err != nil {
		return nil, err
	}
	if inv == nil {
		return nil, fmt.Errorf("plan for %s: no inventory: %w", owner, ErrUnknownGPU)
	}
	var cfg planConfig
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("plan for %s: nil option: %w", owner, node.ErrInvalid)
		}
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("plan for %s: %w", owner, err)
		}
	}
	p := &Plan{Owner: owner}
	for _, c := range inv.ControlDevices {
		if c.Name == node.NVIDIAModeset {
			continue
		}
		p.Devices = append(p.Devices, DeviceNode{Path: filepath.Join(ContainerDevRoot, c.Name), HostPath: c.Path, Major: c.Major, Minor: c.Minor})
	}
	var uuids []string
	for _, g := range gpus {
		if g.MIG != nil {
			if err := checkMIG(inv, g); err != nil {
				return nil, fmt.Errorf("plan for %s: MIG device %s of GPU %d: %w", owner, g.UUID, g.Index, err)
			}
		} else {
			known := slices.ContainsFunc(inv.Devices, func(d node.Device) bool { return d.UUID == g.UUID && d.Node == g.Node })
			if !known || g.Node.Path == "" || g.UUID == "" {
				return nil, fmt.Errorf("plan for %s: GPU %d (%s): %w", owner, g.Index, g.UUID, ErrUnknownGPU)
			}
		}
		p.GPUs = append(p.GPUs, g)
		p.addDevice(GPUNodes(g)...)
		uuids = append(uuids, g.UUID)
	}
	p.Rules = DeviceRules(p.Devices)
	p.Mounts = slices.Clone(mounts)
	visible := strings.Join(uuids, ",")
	if visible == "" {
		visible = "void"
	}
	// The one place the device variables are made: an env that carries
	// them (a plan's Env, made again for other GPUs or after a restart)
	// gets this plan's.
	p.Env = []string{EnvVisibleDevices + "=" + visible, EnvCUDAVisibleDevices + "=" + strings.Join(uuids, ",")}
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k != EnvVisibleDevices && k != EnvCUDAVisibleDevices {
			p.Env = append(p.Env, kv)
		}
	}
	if cfg.mps != nil {
		if err := addMPS(p, *cfg.mps, cfg.mpsEnv); err != nil {
			return nil, fmt.Errorf("plan for %s: %w", owner, err)
		}
	}
	if cfg.numa {
		var err error
		if p.CPUs, p.Mems, err = NUMAAffinity(cfg.sysRoot, numaNodes(inv, p.GPUs)); err != nil {
			return nil, fmt.Errorf("plan for %s: CPU affinity: %w", owner, err)
		}
	}
	return p, nil
}

// GPUNodes are the device nodes a container gets for one allocated device:
// a GPU's node at /dev/<name>; for a MIG device its parent's node and the
// capability nodes of its GPU instance and compute instance, under
// /dev/nvidia-caps as on the host. Each is bound from its path in the node
// model.
func GPUNodes(g node.DeviceRef) []DeviceNode {
	var out []DeviceNode
	if g.Node.Path != "" {
		out = append(out, DeviceNode{
			Path:     filepath.Join(ContainerDevRoot, filepath.Base(g.Node.Path)),
			HostPath: g.Node.Path,
			Major:    g.Node.Major, Minor: g.Node.Minor,
		})
	}
	for _, c := range g.MIG.CapNodes() {
		out = append(out, DeviceNode{
			Path:     filepath.Join(ContainerDevRoot, node.NVIDIACapsDir, filepath.Base(c.Path)),
			HostPath: c.Path,
			Major:    c.Major, Minor: c.Minor,
		})
	}
	return out
}

// DeviceRules is the allow list of a container given devs: the runtime's
// defaults and one rule per node (c <major>:<minor> rwm), canonical.
func DeviceRules(devs []DeviceNode) []Rule {
	rules := DefaultRules()
	for _, d := range devs {
		rules = append(rules, Allow(int64(d.Major), int64(d.Minor), "rwm"))
	}
	return Canonical(rules)
}

// addDevice adds nodes to the plan once each: two MIG devices of one GPU
// share their parent's node.
func (p *Plan) addDevice(devs ...DeviceNode) {
	for _, d := range devs {
		if !slices.Contains(p.Devices, d) {
			p.Devices = append(p.Devices, d)
		}
	}
}

// checkMIG verifies that a MIG reference names a MIG device of inv as
// discovery found it: its parent (by UUID and node), its instance ids and
// both capability nodes, without which the device cannot be isolated.
func checkMIG(inv *node.Inventory, g node.DeviceRef) error {
	i := slices.IndexFunc(inv.Devices, func(d node.Device) bool { return d.UUID == g.MIG.ParentUUID && d.Node == g.Node })
	if i < 0 || g.Node.Path == "" || !node.IsMIGUUID(g.UUID) {
		return ErrUnknownGPU
	}
	k := slices.IndexFunc(inv.Devices[i].MIGDevices, func(m node.MIGDevice) bool { return m.UUID == g.UUID })
	if k < 0 {
		return ErrUnknownGPU
	}
	m := inv.Devices[i].MIGDevices[k]
	if m.GI != g.MIG.GI || m.CI != g.MIG.CI || m.GIAccess != g.MIG.GIAccess || m.CIAccess != g.MIG.CIAccess {
		return fmt.Errorf("instance or capability nodes differ from the node's: %w", ErrUnknownGPU)
	}
	if m.GIAccess.Path == "" || m.CIAccess.Path == "" {
		return ErrNoMIGCaps
	}
	return nil
}

// pathLists are the variables whose value is a list of directories.
var pathLists = []string{"PATH", "LD_LIBRARY_PATH"}

// IsPathList reports whether key names a variable whose value is a list of
// directories (PATH, LD_LIBRARY_PATH). A plan's value for one is the
// image's list with the plan's directories added (see volume.Injection);
// a renderer that cannot see the image's value (a CDI spec) leaves such a
// variable to the image rather than replace it.
func IsPathList(key string) bool { return slices.Contains(pathLists, key) }

// MergeEnv returns base with every "KEY=value" of over set, replacing the
// base's value of the same key in place and appending new keys.
func MergeEnv(base, over []string) []string {
	out := slices.Clone(base)
	for _, kv := range over {
		key, _, _ := strings.Cut(kv, "=")
		i := slices.IndexFunc(out, func(e string) bool { k, _, _ := strings.Cut(e, "="); return k == key })
		if i >= 0 {
			out[i] = kv
		} else {
			out = append(out, kv)
		}
	}
	return out
}
