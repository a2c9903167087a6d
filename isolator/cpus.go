package isolator

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// PlanOption adds to what NewPlan derives.
type PlanOption func(*planConfig) error

type planConfig struct {
	numa    bool
	sysRoot string
	mps     *MPS     // WithShare, WithMPS
	mpsEnv  []string // WithShare: the share's client limits
}

// WithCPUAffinity makes NewPlan pin the container to the CPUs and memory
// nodes local to its GPUs: those of the NUMA nodes the GPUs hang off (the
// union, for GPUs on several), as the host's sysRoot lists them
// (<sysRoot>/devices/system/node/node<N>/cpulist; "" means /sys). A plan
// for no GPU, or for a GPU whose NUMA node discovery could not tell
// (node.NoNUMANode, as NVML reports on many servers), pins nothing: without
// knowing what is local to every GPU, no CPU is preferred. A NUMA node the
// host does not have fails NewPlan with ErrUnknownNUMANode.
func WithCPUAffinity(sysRoot string) PlanOption {
	return func(c *planConfig) error {
		if sysRoot == "" {
			sysRoot = "/sys"
		}
		if !filepath.IsAbs(sysRoot) {
			return fmt.Errorf("%w: sys root %q is not absolute", node.ErrInvalid, sysRoot)
		}
		c.numa, c.sysRoot = true, filepath.Clean(sysRoot)
		return nil
	}
}

// numaNodes are the NUMA nodes of gpus (a MIG device's is its parent's),
// sorted, or nil when gpus is empty or any one's is unknown.
func numaNodes(inv *node.Inventory, gpus []node.DeviceRef) []int {
	var out []int
	for _, g := range gpus {
		uuid := g.UUID
		if g.MIG != nil {
			uuid = g.MIG.ParentUUID
		}
		i := slices.IndexFunc(inv.Devices, func(d node.Device) bool { return d.UUID == uuid })
		if i < 0 || inv.Devices[i].NUMANode < 0 {
			return nil
		}
		if n := inv.Devices[i].NUMANode; !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// NUMAAffinity returns the CPUs and memory nodes local to nodes, the NUMA
// nodes given, in the kernel's list format ("0-3,8"): the union of their
// CPU lists under sysRoot, and the nodes themselves. No nodes give "", "".
func NUMAAffinity(sysRoot string, nodes []int) (cpus, mems string, err error) {
	if len(nodes) == 0 {
		return "", "", nil
	}
	var all []int
	for _, n := range nodes {
		p := filepath.Join(sysRoot, "devices", "system", "node", "node"+strconv.Itoa(n), "cpulist")
		b, err := os.ReadFile(p)
		if err != nil {
			return "", "", fmt.Errorf("NUMA node %d: %w: %w", n, ErrUnknownNUMANode, err)
		}
		list, err := ParseList(strings.TrimSpace(string(b)))
		if err != nil {
			return "", "", fmt.Errorf("NUMA node %d: %s: %w", n, p, err)
		}
		all = append(all, list...)
	}
	if len(all) == 0 {
		return "", "", fmt.Errorf("NUMA nodes %s: %w: they have no CPU", FormatList(nodes), ErrUnknownNUMANode)
	}
	return FormatList(all), FormatList(nodes), nil
}

// ParseList reads a list in the kernel's format for CPU and node sets:
// comma-separated numbers and ranges ("0-3,8,10-11"); "" is the empty list.
// The result is sorted, each number once.
func ParseList(s string) ([]int, error) {
	var out []int
	if s == "" {
		return nil, nil
	}
	for _, f := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(f, "-")
		a, err := strconv.ParseUint(lo, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("%w: list %q: %q is not a number or range", node.ErrInvalid, s, f)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 16); err != nil || b < a {
				return nil, fmt.Errorf("%w: list %q: %q is not a range", node.ErrInvalid, s, f)
			}
		}
		for n := a; n <= b; n++ {
			out = append(out, int(n))
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// FormatList writes numbers in the kernel's list format, ranges joined:
// {0,1,2,3,8} is "0-3,8". Order and repeats in ns do not matter.
func FormatList(ns []int) string {
	s := slices.Clone(ns)
	slices.Sort(s)
	s = slices.Compact(s)
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(s[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(s[j]))
		}
		i = j + 1
	}
	return b.String()
}
