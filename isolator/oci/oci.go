package oci

import (
	"fmt"
	"os"
	"slices"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
)

// ErrNoLinux: the spec has no Linux section to edit.
var ErrNoLinux = node.Sentinel(node.ErrInvalid, "spec has no linux section")

// Apply edits spec in place so that the container gets what plan says: its
// device nodes, a deny-all followed by the plan's device rules, its mounts,
// its CPUs and memory nodes when the plan pins them, and its environment
// set over the spec's. It is idempotent: applying a plan twice gives the spec of applying it once.
// On error spec is left as it was.
func Apply(spec *specs.Spec, plan *isolator.Plan) error {
	if spec == nil || spec.Linux == nil {
		return fmt.Errorf("apply plan of %s: %w", plan.Owner, ErrNoLinux)
	}
	if spec.Process == nil {
		spec.Process = &specs.Process{}
	}
	if spec.Linux.Resources == nil {
		spec.Linux.Resources = &specs.LinuxResources{}
	}
	mode := os.FileMode(0o666)
	zero := uint32(0)
	for _, d := range plan.Devices {
		dev := specs.LinuxDevice{Path: d.Path, Type: "c", Major: int64(d.Major), Minor: int64(d.Minor), FileMode: &mode, UID: &zero, GID: &zero}
		i := slices.IndexFunc(spec.Linux.Devices, func(e specs.LinuxDevice) bool { return e.Path == d.Path })
		if i >= 0 {
			spec.Linux.Devices[i] = dev
		} else {
			spec.Linux.Devices = append(spec.Linux.Devices, dev)
		}
	}

	rules := spec.Linux.Resources.Devices
	denyAll := isolator.Rule{Type: 'a', Major: isolator.Wildcard, Minor: isolator.Wildcard, Access: "rwm"}.LinuxDeviceCgroup()
	if len(rules) == 0 || !isDenyAll(rules[0]) {
		rules = append([]specs.LinuxDeviceCgroup{denyAll}, rules...)
	}
	for _, pr := range planRules(plan) {
		r := pr.LinuxDeviceCgroup()
		if !slices.ContainsFunc(rules, func(e specs.LinuxDeviceCgroup) bool { return sameRule(e, r) }) {
			rules = append(rules, r)
		}
	}
	spec.Linux.Resources.Devices = rules

	for _, m := range plan.Mounts {
		i := slices.IndexFunc(spec.Mounts, func(e specs.Mount) bool { return e.Destination == m.Destination })
		if i >= 0 {
			spec.Mounts[i] = m
		} else {
			spec.Mounts = append(spec.Mounts, m)
		}
	}
	if plan.CPUs != "" || plan.Mems != "" {
		if spec.Linux.Resources.CPU == nil {
			spec.Linux.Resources.CPU = &specs.LinuxCPU{}
		}
		spec.Linux.Resources.CPU.Cpus, spec.Linux.Resources.CPU.Mems = plan.CPUs, plan.Mems
	}
	spec.Process.Env = isolator.MergeEnv(spec.Process.Env, plan.Env)
	return nil
}

// planRules are the plan's device rules: Rules, or, for a plan made by
// hand without them, the rules of its nodes.
func planRules(plan *isolator.Plan) []isolator.Rule {
	if len(plan.Rules) > 0 {
		return plan.Rules
	}
	return isolator.DeviceRules(plan.Devices)
}

func isDenyAll(r specs.LinuxDeviceCgroup) bool {
	return !r.Allow && (r.Type == "" || r.Type == "a") && (r.Major == nil || *r.Major == -1) && (r.Minor == nil || *r.Minor == -1) && (r.Access == "" || r.Access == "rwm")
}

func sameRule(a, b specs.LinuxDeviceCgroup) bool {
	num := func(p *int64) int64 {
		if p == nil {
			return -1
		}
		return *p
	}
	return a.Allow == b.Allow && a.Type == b.Type && num(a.Major) == num(b.Major) && num(a.Minor) == num(b.Minor) && a.Access == b.Access
}
