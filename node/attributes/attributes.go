// Package attributes renders a node's GPUs as the attributes schedulers
// filter nodes by: Kubernetes node labels, as GPU feature discovery names
// them, and Mesos agent attributes. Every function is a pure function of
// the node model.
package attributes

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// Mesos returns the GPUs of inv as Mesos-style agent attributes, for
// schedulers that filter nodes by GPU type: gpus (the count of devices
// whose Health is healthy), gpus_total, gpu_models (comma-separated,
// sorted), gpu_memory_mib (the smallest of the node), driver_version and
// cuda_version. FormatMesos writes them as an agent's --attributes flag.
// A nil inv has none.
func Mesos(inv *node.Inventory) map[string]string {
	if inv == nil {
		return nil
	}
	sum := summarize(inv.Devices)
	out := map[string]string{
		"gpus":       strconv.Itoa(sum.healthy),
		"gpus_total": strconv.Itoa(len(inv.Devices)),
	}
	if len(sum.models) > 0 {
		out["gpu_models"] = strings.Join(sum.models, ",")
	}
	if sum.memMiB > 0 {
		out["gpu_memory_mib"] = strconv.FormatUint(sum.memMiB, 10)
	}
	if inv.DriverVersion != "" {
		out["driver_version"] = inv.DriverVersion
	}
	if inv.CUDAVersion > 0 {
		out["cuda_version"] = inv.CUDAVersion.String()
	}
	return out
}

// Labels returns the GPUs of inv as Kubernetes-style node labels, as GPU
// feature discovery names them (nvidia.com/gpu.present, gpu.count,
// gpu.product, gpu.memory in MiB, gpu.family, gpu.compute.major/minor,
// cuda.driver.major/minor/rev, cuda.runtime.major/minor). Values are valid
// label values (LabelValue); a node of several models has gpu.product
// "mixed". A nil inv has no labels.
func Labels(inv *node.Inventory) map[string]string {
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
		major, minor, _ := strings.Cut(sum.compute[0], ".")
		out["nvidia.com/gpu.compute.major"] = LabelValue(major)
		if minor != "" {
			out["nvidia.com/gpu.compute.minor"] = LabelValue(minor)
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

// FormatMesos writes attributes as "name:value;name:value", sorted by
// name, for a Mesos agent's --attributes flag; a ';' or ':' in a value
// becomes '_'.
func FormatMesos(attrs map[string]string) string {
	keys := make([]string, 0, len(attrs))
	for k := range attrs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	clean := strings.NewReplacer(";", "_", ":", "_")
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s:%s", k, clean.Replace(attrs[k]))
	}
	return strings.Join(parts, ";")
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

// summary is what a node's devices are.
type summary struct {
	healthy                   int
	models, families, compute []string
	memMiB                    uint64
}

func summarize(devices []node.Device) summary {
	var s summary
	models, families, compute := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, d := range devices {
		if d.Health.Healthy {
			s.healthy++
		}
		if d.Model != "" {
			models[d.Model] = true
		}
		if d.Architecture != "" {
			families[d.Architecture] = true
		}
		if d.ComputeCapability != "" {
			compute[d.ComputeCapability] = true
		}
		if mib := d.MemoryBytes >> 20; mib > 0 && (s.memMiB == 0 || mib < s.memMiB) {
			s.memMiB = mib
		}
	}
	s.models, s.families, s.compute = sortedKeys(models), sortedKeys(families), sortedKeys(compute)
	return s
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
