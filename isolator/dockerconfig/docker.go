package dockerconfig

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
)

// Labels gpuiso puts on the containers it creates.
const (
	// LabelOwner holds the owner (the container's id in the allocator).
	LabelOwner = "io.gpuiso.owner"
	// LabelGPUs holds the GPUs the owner was given, as a JSON array of
	// node.DeviceRef.
	LabelGPUs = "io.gpuiso.gpus"
)

// CgroupPermissions are the device cgroup permissions of every mapping.
const CgroupPermissions = "rwm"

// Config is what a Docker container must get for its GPUs, as plain data.
type Config struct {
	// Devices map the plan's nodes from the host into the container.
	Devices []container.DeviceMapping `json:"devices"`
	// DeviceCgroupRules are the plan's device rules beyond the defaults
	// every container gets ("c 195:1 rwm"): the rules of its nodes, which
	// the daemon also derives from the mappings.
	DeviceCgroupRules []string `json:"deviceCgroupRules,omitempty"`
	// DeviceRequests ask a CDI-aware daemon for the GPUs (see NewCDI).
	DeviceRequests []container.DeviceRequest `json:"deviceRequests,omitempty"`
	// Mounts are read-only bind mounts, such as the driver volume.
	Mounts []mount.Mount `json:"mounts,omitempty"`
	// Env are "KEY=value" settings over the image's environment.
	Env []string `json:"env"`
	// Labels record the owner and its GPUs (see ParseLabels) and how the
	// GPUs are injected (LabelInjection).
	Labels map[string]string `json:"labels"`
	// CpusetCpus and CpusetMems pin the container as the plan says (its
	// CPUs and Mems); empty leaves the host config's as they are.
	CpusetCpus string `json:"cpusetCpus,omitempty"`
	CpusetMems string `json:"cpusetMems,omitempty"`
}

// New computes the Docker configuration of plan. Every device must have a
// host path; every mount must be a bind mount (the plan's mounts are
// read-only binds, and so are the mappings made of them).
func New(plan *isolator.Plan) (*Config, error) {
	if plan == nil {
		return nil, fmt.Errorf("docker config: %w: no plan", ErrInvalidPlan)
	}
	c := &Config{Env: slices.Clone(plan.Env), CpusetCpus: plan.CPUs, CpusetMems: plan.Mems}
	for _, d := range plan.Devices {
		if d.HostPath == "" || d.Path == "" {
			return nil, fmt.Errorf("docker config of %s: %w: device %d:%d has no path", plan.Owner, ErrInvalidPlan, d.Major, d.Minor)
		}
		c.Devices = append(c.Devices, container.DeviceMapping{PathOnHost: d.HostPath, PathInContainer: d.Path, CgroupPermissions: CgroupPermissions})
	}
	rules := plan.Rules
	if len(rules) == 0 {
		rules = isolator.DeviceRules(plan.Devices)
	}
	defaults := isolator.DefaultRules()
	for _, r := range rules {
		if r.Allow && !slices.Contains(defaults, r) {
			c.DeviceCgroupRules = append(c.DeviceCgroupRules, r.String())
		}
	}
	for _, m := range plan.Mounts {
		bind := m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
		if !bind || m.Source == "" || m.Destination == "" {
			return nil, fmt.Errorf("docker config of %s: %w: mount of %q at %q is not a bind mount", plan.Owner, ErrInvalidPlan, m.Source, m.Destination)
		}
		dm := mount.Mount{Type: mount.TypeBind, Source: m.Source, Target: m.Destination, ReadOnly: !slices.Contains(m.Options, "rw")}
		if slices.Contains(m.Options, "bind") && !slices.Contains(m.Options, "rbind") {
			dm.BindOptions = &mount.BindOptions{NonRecursive: true}
		}
		c.Mounts = append(c.Mounts, dm)
	}
	gpus := plan.GPUs
	if gpus == nil {
		gpus = []node.DeviceRef{}
	}
	b, err := json.Marshal(gpus)
	if err != nil {
		return nil, fmt.Errorf("docker config of %s: %w", plan.Owner, err)
	}
	c.Labels = map[string]string{LabelOwner: plan.Owner, LabelGPUs: string(b), LabelInjection: InjectionDevices}
	return c, nil
}

// Apply writes c into a container's configuration: device mappings and
// mounts replace those with the same container path and are added
// otherwise, device cgroup rules are added once, a device request replaces the one of the same driver, the environment is set over cfg's, and the labels are set.
// Applying twice gives what applying once gives. On error nothing changes.
func (c *Config) Apply(cfg *container.Config, hc *container.HostConfig) error {
	if cfg == nil || hc == nil {
		return fmt.Errorf("apply docker config of %s: %w", c.Labels[LabelOwner], ErrNilConfig)
	}
	for _, d := range c.Devices {
		i := slices.IndexFunc(hc.Devices, func(e container.DeviceMapping) bool { return e.PathInContainer == d.PathInContainer })
		if i >= 0 {
			hc.Devices[i] = d
		} else {
			hc.Devices = append(hc.Devices, d)
		}
	}
	for _, r := range c.DeviceCgroupRules {
		if !slices.Contains(hc.DeviceCgroupRules, r) {
			hc.DeviceCgroupRules = append(hc.DeviceCgroupRules, r)
		}
	}
	c.applyRequests(hc)
	for _, m := range c.Mounts {
		m.BindOptions = cloneBind(m.BindOptions)
		i := slices.IndexFunc(hc.Mounts, func(e mount.Mount) bool { return e.Target == m.Target })
		if i >= 0 {
			hc.Mounts[i] = m
		} else {
			hc.Mounts = append(hc.Mounts, m)
		}
	}
	if c.CpusetCpus != "" {
		hc.CpusetCpus = c.CpusetCpus
	}
	if c.CpusetMems != "" {
		hc.CpusetMems = c.CpusetMems
	}
	cfg.Env = isolator.MergeEnv(cfg.Env, c.Env)
	if cfg.Labels == nil {
		cfg.Labels = map[string]string{}
	}
	maps.Copy(cfg.Labels, c.Labels)
	return nil
}

func cloneBind(b *mount.BindOptions) *mount.BindOptions {
	if b == nil {
		return nil
	}
	c := *b
	return &c
}

// ParseLabels reads the owner and GPUs that New recorded in a container's
// labels. A container without LabelOwner is not gpuiso's: the error then
// matches ErrInvalidLabels like any other problem.
func ParseLabels(labels map[string]string) (owner string, gpus []node.DeviceRef, err error) {
	owner, ok := labels[LabelOwner]
	if !ok {
		return "", nil, &LabelError{Label: LabelOwner, Reason: "missing"}
	}
	if err := node.ValidateOwner(owner); err != nil {
		return "", nil, &LabelError{Label: LabelOwner, Value: owner, Reason: err.Error()}
	}
	raw, ok := labels[LabelGPUs]
	if !ok {
		return "", nil, &LabelError{Label: LabelGPUs, Reason: "missing"}
	}
	if err := json.Unmarshal([]byte(raw), &gpus); err != nil {
		return "", nil, &LabelError{Label: LabelGPUs, Value: raw, Reason: err.Error()}
	}
	for _, g := range gpus {
		if g.UUID == "" || g.Index < 0 {
			return "", nil, &LabelError{Label: LabelGPUs, Value: raw, Reason: "a GPU without index or UUID"}
		}
	}
	return owner, gpus, nil
}
