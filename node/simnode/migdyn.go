package simnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// ErrMIGFull: a GPU has no room for another instance of a profile.
var ErrMIGFull = fmt.Errorf("no room for the MIG instance: %w", node.ErrInsufficient)

// ErrMIGFault is the failure a MIGManager injects (see FailAfter).
var ErrMIGFault = node.Sentinel(node.ErrUnavailable, "injected MIG failure")

// MIGManager creates and destroys MIG devices on the simulated node's GPUs
// with MIG enabled: dynamic MIG, in simulation only (it changes the
// simulated driver's layout, never a real GPU's). Its methods are what
// allocator.WithMIGManager takes. With a Host, a new device also gets its
// capability files and nodes in the host tree, and loses them when
// destroyed. Each call is all or nothing.
type MIGManager struct {
	n         *Node
	h         *Host
	failAfter int // creations left before injected failures; < 0: none
}

// MIGManager returns a manager of the node's MIG layout; h may be nil.
func (n *Node) MIGManager(h *Host) *MIGManager { return &MIGManager{n: n, h: h, failAfter: -1} }

// FailAfter makes creations fail with ErrMIGFault after k more succeed
// (k < 0: never), for tests of what a failed step leaves behind.
func (m *MIGManager) FailAfter(k int) { m.failAfter = k }

// CreateMIG creates a GPU instance of profile on the GPU with UUID parent,
// at the first free placement the profile allows, with one compute instance
// spanning it, and returns the new MIG device as discovery would read it.
func (m *MIGManager) CreateMIG(ctx context.Context, parent, profile string) (node.MIGDevice, error) {
	return m.create(ctx, parent, profile, nil)
}

// CreateMIGAt is CreateMIG at the placement that starts at memory slice
// start: an error matching node.ErrInsufficient when an instance overlaps
// it or the GPU holds no more of the profile, ErrMIGLayout when the
// profile has no such placement.
func (m *MIGManager) CreateMIGAt(ctx context.Context, parent, profile string, start int) (node.MIGDevice, error) {
	return m.create(ctx, parent, profile, &start)
}

func (m *MIGManager) create(ctx context.Context, parent, profile string, at *int) (node.MIGDevice, error) {
	if err := ctx.Err(); err != nil {
		return node.MIGDevice{}, err
	}
	n := m.n
	i := -1
	for k := range n.spec.GPUs {
		if n.UUID(k) == parent {
			i = k
		}
	}
	if i < 0 {
		return node.MIGDevice{}, fmt.Errorf("create %s on %s: %w", profile, parent, ErrNoSuchGPU)
	}
	if n.isLost(i) {
		return node.MIGDevice{}, fmt.Errorf("create %s on GPU %d: GPU is lost: %w", profile, i, node.ErrUnavailable)
	}
	p, ok := profileByName(n.spec.profiles(), profile)
	if !ok {
		return node.MIGDevice{}, fmt.Errorf("create %s on GPU %d: %w", profile, i, ErrMIGLayout)
	}
	if m.failAfter == 0 {
		return node.MIGDevice{}, fmt.Errorf("create %s on GPU %d: %w", profile, i, ErrMIGFault)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	st := &n.mig[i]
	if !st.enabled {
		return node.MIGDevice{}, fmt.Errorf("create %s on GPU %d: MIG is disabled: %w", profile, i, ErrMIGLayout)
	}
	var have []placed
	for _, in := range st.instances {
		have = append(have, placed{in.profile, in.start})
	}
	if at != nil && !slices.Contains(p.starts, *at) {
		return node.MIGDevice{}, fmt.Errorf("create %s on GPU %d at %d: not one of the profile's placements %v: %w", profile, i, *at, p.starts, ErrMIGLayout)
	}
	start, err := placeOne(p, have, at)
	if err != nil {
		return node.MIGDevice{}, fmt.Errorf("create %s on GPU %d: %w: %w", profile, i, ErrMIGFull, err)
	}
	in := n.newInstance(i, p, start)
	next := append(slices.Clone(st.instances), in)
	sortInstances(next)
	if m.h != nil {
		err := m.makeCaps(i, in)
		if err == nil {
			err = n.saveLayoutLocked(m.h, i, next)
		}
		if err != nil {
			m.removeCaps(i, in)
			return node.MIGDevice{}, fmt.Errorf("create %s on GPU %d: %w", profile, i, err)
		}
	}
	st.instances = next
	if m.failAfter > 0 {
		m.failAfter--
	}
	return m.device(i, in), nil
}

// DestroyMIG destroys the MIG device with UUID device on GPU parent (its
// compute instance, then its GPU instance).
func (m *MIGManager) DestroyMIG(ctx context.Context, parent, device string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n := m.n
	n.mu.Lock()
	defer n.mu.Unlock()
	for i := range n.spec.GPUs {
		if n.UUID(i) != parent {
			continue
		}
		st := &n.mig[i]
		k := slices.IndexFunc(st.instances, func(in *migInstance) bool { return in.uuid == device })
		if k < 0 {
			break
		}
		in := st.instances[k]
		next := slices.Delete(slices.Clone(st.instances), k, k+1)
		if m.h != nil {
			if err := n.saveLayoutLocked(m.h, i, next); err != nil {
				return fmt.Errorf("destroy %s on %s: %w", device, parent, err)
			}
			m.removeCaps(i, in)
		}
		st.instances = next
		return nil
	}
	return fmt.Errorf("destroy %s on %s: %w", device, parent, ErrNoSuchMIGDevice)
}

// device is the MIG device as discovery reads it from the host tree.
func (m *MIGManager) device(i int, in *migInstance) node.MIGDevice {
	d := node.MIGDevice{
		Parent: i, ParentUUID: m.n.UUID(i), UUID: in.uuid, GI: in.gi, CI: in.ci,
		Profile: in.profile.name, ProfileID: in.profile.id,
		Placement:   node.MIGPlacement{Start: in.start, Size: in.profile.size},
		MemoryBytes: uint64(in.profile.memMiB) * mib, SMs: in.profile.sms, Health: node.Healthy(),
	}
	if m.h != nil {
		g := m.n.spec.minor(i)
		d.GIAccess = m.capNode(giAccessMinor(g, in.gi))
		d.CIAccess = m.capNode(ciAccessMinor(g, in.gi, in.ci))
	}
	return d
}

func (m *MIGManager) capNode(minor int) node.DeviceNode {
	return node.DeviceNode{Path: filepath.Join(m.h.DevRoot, node.NVIDIACapsDir, fmt.Sprintf("nvidia-cap%d", minor)), Major: m.h.CapsMajor, Minor: uint32(minor)}
}

func (m *MIGManager) capDir(i int, in *migInstance) string {
	return filepath.Join(m.h.ProcRoot, "driver", "nvidia", "capabilities", fmt.Sprintf("gpu%d", m.n.spec.minor(i)), "mig", fmt.Sprintf("gi%d", in.gi))
}

// makeCaps writes the instance's capability files and nodes.
func (m *MIGManager) makeCaps(i int, in *migInstance) error {
	g := m.n.spec.minor(i)
	dir := m.capDir(i, in)
	gm, cm := giAccessMinor(g, in.gi), ciAccessMinor(g, in.gi, in.ci)
	files := map[string]int{filepath.Join(dir, "access"): gm, filepath.Join(dir, fmt.Sprintf("ci%d", in.ci), "access"): cm}
	for path, minor := range files {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 292\nDeviceFileModify: 1\n", minor)), 0o444); err != nil {
			return err
		}
	}
	for _, minor := range []int{gm, cm} {
		c := m.capNode(minor)
		if err := linux.Mknod(c.Path, 0o444, linux.DeviceNumber{Char: true, Major: c.Major, Minor: c.Minor}); err != nil {
			return err
		}
	}
	return nil
}

// removeCaps removes what makeCaps made (what exists of it).
func (m *MIGManager) removeCaps(i int, in *migInstance) {
	g := m.n.spec.minor(i)
	os.RemoveAll(m.capDir(i, in))
	os.Remove(m.capNode(giAccessMinor(g, in.gi)).Path)
	os.Remove(m.capNode(ciAccessMinor(g, in.gi, in.ci)).Path)
}
