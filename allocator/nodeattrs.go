package allocator

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// NodeAttributes returns the node's GPUs as Mesos-style agent attributes,
// for schedulers that filter nodes by GPU type: gpus (healthy count),
// gpus_total, gpu_models (comma-separated, sorted), gpu_memory_mib (the
// smallest of the node), driver_version and cuda_version.
// FormatMesosAttributes writes them as an agent's --attributes flag.
func (a *Allocator) NodeAttributes() map[string]string {
	if a.inv == nil {
		return nil
	}
	sum := a.summary()
	out := map[string]string{
		"gpus":       strconv.Itoa(sum.healthy),
		"gpus_total": strconv.Itoa(a.n),
	}
	if len(sum.models) > 0 {
		out["gpu_models"] = strings.Join(sum.models, ",")
	}
	if sum.memMiB > 0 {
		out["gpu_memory_mib"] = strconv.FormatUint(sum.memMiB, 10)
	}
	if a.inv.DriverVersion != "" {
		out["driver_version"] = a.inv.DriverVersion
	}
	if a.inv.CUDAVersion > 0 {
		out["cuda_version"] = a.inv.CUDAVersion.String()
	}
	return out
}

// Labels returns the node's GPUs as Kubernetes-style node labels: those
// of LabelsOf for the allocator's inventory.
func (a *Allocator) Labels() map[string]string {
	if a.inv == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refresh()
	return LabelsOf(a.inv)
}

// LabelsOf returns the GPUs of inv as Kubernetes-style node labels, as GPU
// feature discovery names them (nvidia.com/gpu.present, gpu.count,
// gpu.product, gpu.memory in MiB, gpu.family, gpu.compute.major/minor,
// cuda.driver.major/minor/rev, cuda.runtime.major/minor). Values are valid
// label values (LabelValue); a node of several models has gpu.product
// "mixed". It is a pure function of inv; a nil inv has no labels.
func LabelsOf(inv *node.Inventory) map[string]string {
	if inv == nil {
		return nil
	}
	sum := summarize(inv.Devices)
	n := len(inv.Devices)
	out := map[string]string{
		"nvidia.com/gpu.present": strconv.FormatBool(n > 0),
		"nvidia.com/gpu.count":   strconv.Itoa(n),
	}
	switch len(sum.models) {
	case 0:
	case 1:
		out["nvidia.com/gpu.product"] = LabelValue(sum.models[0])
	default:
		out["nvidia.com/gpu.product"] = "mixed"
	}
	if sum.memMiB > 0 {
		out["nvidia.com/gpu.memory"] = strconv.FormatUint(sum.memMiB, 10)
	}
	if len(sum.families) == 1 {
		out["nvidia.com/gpu.family"] = LabelValue(sum.families[0])
	}
	if len(sum.compute) == 1 {
		ma, mi, _ := strings.Cut(sum.compute[0], ".")
		out["nvidia.com/gpu.compute.major"] = LabelValue(ma)
		if mi != "" {
			out["nvidia.com/gpu.compute.minor"] = LabelValue(mi)
		}
	}
	if v := inv.DriverVersion; v != "" {
		parts := strings.SplitN(v, ".", 3)
		for i, k := range []string{"major", "minor", "rev"} {
			if i < len(parts) {
				out["nvidia.com/cuda.driver."+k] = LabelValue(parts[i])
			}
		}
	}
	if c := inv.CUDAVersion; c > 0 {
		out["nvidia.com/cuda.runtime.major"] = strconv.Itoa(c.Major())
		out["nvidia.com/cuda.runtime.minor"] = strconv.Itoa(c.Minor())
	}
	return out
}

// FormatMesosAttributes writes attributes as "name:value;name:value",
// sorted by name, for a Mesos agent's --attributes flag.
func FormatMesosAttributes(attrs map[string]string) string {
	keys := make([]string, 0, len(attrs))
	for k := range attrs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		v := strings.NewReplacer(";", "_", ":", "_").Replace(attrs[k])
		parts[i] = fmt.Sprintf("%s:%s", k, v)
	}
	return strings.Join(parts, ";")
}

type nodeSummary struct {
	healthy                   int
	models, families, compute []string
	memMiB                    uint64
}

func (a *Allocator) summary() nodeSummary {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refresh()
	s := summarize(a.inv.Devices)
	for p := range a.inv.Devices {
		if a.health[p].Healthy {
			s.healthy++
		}
	}
	return s
}

// summarize is what the devices are of (healthy left 0: the inventory's
// health is not the allocator's).
func summarize(devices []node.Device) nodeSummary {
	var s nodeSummary
	models, fams, ccs := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, d := range devices {
		if d.Model != "" {
			models[d.Model] = true
		}
		if d.Architecture != "" {
			fams[d.Architecture] = true
		}
		if d.ComputeCapability != "" {
			ccs[d.ComputeCapability] = true
		}
		if mib := d.MemoryBytes >> 20; mib > 0 && (s.memMiB == 0 || mib < s.memMiB) {
			s.memMiB = mib
		}
	}
	s.models, s.families, s.compute = sortedKeys(models), sortedKeys(fams), sortedKeys(ccs)
	return s
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// LabelValue makes s a valid Kubernetes label value: at most 63 of
// [A-Za-z0-9-_.], beginning and ending with an alphanumeric; anything else
// becomes "-". It is the one cleaner of label values (the Kubernetes
// module's labels and DRA attributes use it too).
func LabelValue(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '-'
		}
	}
	if len(b) > 63 {
		b = b[:63]
	}
	return strings.Trim(string(b), "-_.")
}
