// Package nri places the containers that hold a node's GPUs on the CPUs
// and memory nodes of those GPUs, through the container runtime's Node
// Resource Interface (containerd 2 and CRI-O have it on by default).
//
// The DRA driver and the device plugin give a container its GPUs; where
// its processes run is the kubelet's, whose Topology Manager does not align
// DRA claims. NRI shows a plugin each container as the runtime is about to
// create it, with its device nodes after the CDI specs are applied, and
// lets it set the container's cpuset. [Plugin] does that with policy
// [PolicyNUMA]: a container with the device node of one or more of the
// node's GPUs (a MIG device's parent counts; its node is the parent's) gets
// the CPUs of their NUMA nodes (the union, for GPUs on several) and, of
// those nodes, the ones with memory as its memory nodes. A container with
// no GPU, or with a GPU whose NUMA node is unknown (NVML's -1, as on many
// servers), is left as it is; so is every container with [PolicyNone].
//
// The GPUs are told by the device nodes the runtime gives the container
// (/dev/nvidia<minor>, a character device of that minor), never by its
// environment: an image cannot ask for a placement.
package nri

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
)

// Policy is what Plugin does with a container that holds GPUs.
type Policy string

const (
	// PolicyNone leaves every container as it is.
	PolicyNone Policy = "none"
	// PolicyNUMA puts a container on the CPUs and memory nodes of its
	// GPUs' NUMA nodes.
	PolicyNUMA Policy = "numa"
)

// ErrInvalid is a bad policy or configuration; it matches node.ErrInvalid.
var ErrInvalid = fmt.Errorf("nri: %w", node.ErrInvalid)

// ParsePolicy reads a policy's name: "none" or "numa".
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case PolicyNone, PolicyNUMA:
		return p, nil
	}
	return "", fmt.Errorf("%w: policy %q, want %s or %s", ErrInvalid, s, PolicyNone, PolicyNUMA)
}

// Plugin is gpuiso's NRI plugin: it answers the runtime's CreateContainer
// with the placement of the container's GPUs (see the package's doc). Make
// it with New.
type Plugin struct {
	policy  Policy
	sysRoot string
	numa    map[int64]int // a GPU's device minor: its NUMA node
	log     *slog.Logger
}

// New returns the plugin of policy for the GPUs of inv, whose NUMA nodes'
// CPUs and memory are read under sysRoot (<sysRoot>/devices/system/node:
// node<N>/cpulist and has_memory; "" means /sys). log, when not nil, is
// told of every placement.
func New(inv *node.Inventory, policy Policy, sysRoot string, log *slog.Logger) (*Plugin, error) {
	if _, err := ParsePolicy(string(policy)); err != nil {
		return nil, err
	}
	if inv == nil {
		return nil, fmt.Errorf("%w: no inventory", ErrInvalid)
	}
	if sysRoot == "" {
		sysRoot = "/sys"
	}
	if !filepath.IsAbs(sysRoot) {
		return nil, fmt.Errorf("%w: sys root %q is not absolute", ErrInvalid, sysRoot)
	}
	p := &Plugin{policy: policy, sysRoot: filepath.Clean(sysRoot), numa: map[int64]int{}, log: log}
	for _, d := range inv.Devices {
		if d.Minor != node.NoMinor {
			p.numa[int64(d.Minor)] = d.NUMANode
		}
	}
	return p, nil
}

// CreateContainer places ctr on its GPUs' CPUs and memory nodes, with
// policy numa; a container without GPUs, or one whose GPUs' placement
// cannot be told, gets no adjustment. A NUMA node the host does not list
// fails the container's creation: pinning it elsewhere would hide the
// misconfiguration.
func (p *Plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	cpus, mems, err := p.Placement(ctr)
	if err != nil || cpus == "" {
		return nil, nil, err
	}
	adj := &api.ContainerAdjustment{}
	adj.SetLinuxCPUSetCPUs(cpus)
	if mems != "" {
		adj.SetLinuxCPUSetMems(mems)
	}
	if p.log != nil {
		p.log.Info("container placed on its GPUs' NUMA nodes", "pod", pod.GetNamespace()+"/"+pod.GetName(), "container", ctr.GetName(), "cpus", cpus, "mems", mems)
	}
	return adj, nil, nil
}

// Placement is the cpuset Plugin gives ctr: the CPUs and memory nodes of
// its GPUs' NUMA nodes in the kernel's list format, or "", "" for none.
func (p *Plugin) Placement(ctr *api.Container) (cpus, mems string, err error) {
	if p.policy != PolicyNUMA {
		return "", "", nil
	}
	var nodes []int
	for _, d := range ctr.GetLinux().GetDevices() {
		minor, ok := gpuMinor(d)
		if !ok {
			continue
		}
		n, known := p.numa[minor]
		if !known {
			continue // not one of the node's GPUs
		}
		if n < 0 {
			return "", "", nil // one GPU's NUMA node unknown: no preference
		}
		if !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	if len(nodes) == 0 {
		return "", "", nil
	}
	slices.Sort(nodes)
	cpus, _, err = isolator.NUMAAffinity(p.sysRoot, nodes)
	if err != nil {
		return "", "", fmt.Errorf("place container %s: %w", ctr.GetName(), err)
	}
	withMemory, err := p.memoryNodes()
	if err != nil {
		return "", "", fmt.Errorf("place container %s: %w", ctr.GetName(), err)
	}
	var memNodes []int
	for _, n := range nodes {
		if withMemory == nil || slices.Contains(withMemory, n) {
			memNodes = append(memNodes, n)
		}
	}
	return cpus, isolator.FormatList(memNodes), nil
}

// memoryNodes are the NUMA nodes with memory (has_memory), or nil when the
// kernel does not say (every node then counts).
func (p *Plugin) memoryNodes() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(p.sysRoot, "devices", "system", "node", "has_memory"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	list, err := isolator.ParseList(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, err
	}
	if list == nil {
		list = []int{}
	}
	return list, nil
}

// gpuMinor is the minor of d when it is a GPU's device node:
// /dev/nvidia<minor>, a character device of that minor.
func gpuMinor(d *api.LinuxDevice) (int64, bool) {
	s, ok := strings.CutPrefix(d.GetPath(), "/dev/nvidia")
	if !ok || s == "" || d.GetType() != "c" {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 20)
	if err != nil || strconv.FormatUint(n, 10) != s || int64(n) != d.GetMinor() {
		return 0, false
	}
	return int64(n), true
}
