package chain

import (
	"context"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
)

// devices is what the isolator needs of the kernel's device cgroup: the
// calls of cgroups.Isolator, on a cgroup named by its parent and its last
// element. Tests give a recording fake.
type devices interface {
	Apply(ctx context.Context, parent, name string, rules []isolator.Rule) error
	AddProcess(ctx context.Context, parent, name string, pid int) error
	Processes(ctx context.Context, parent, name string) ([]int, error)
	Destroy(ctx context.Context, parent, name string) error
	Owners(ctx context.Context, parent string) ([]string, error)
	RemoveParent(parent string) error
}

// cgroupDevices is devices on a cgroups.Isolator, moved to each call's
// parent.
type cgroupDevices struct{ base *cgroups.Isolator }

// enforce finds cpuSetter by a type assertion, which a changed signature
// would fail quietly (pinning refused as not supported).
var _ cpuSetter = cgroupDevices{}

func (d cgroupDevices) at(parent string) (*cgroups.Isolator, error) {
	if parent == d.base.Parent() {
		return d.base, nil
	}
	return d.base.InParent(parent)
}

func (d cgroupDevices) Apply(ctx context.Context, parent, name string, rules []isolator.Rule) error {
	c, err := d.at(parent)
	if err != nil {
		return err
	}
	return c.Apply(ctx, name, rules)
}

func (d cgroupDevices) AddProcess(ctx context.Context, parent, name string, pid int) error {
	c, err := d.at(parent)
	if err != nil {
		return err
	}
	return c.AddProcess(ctx, name, pid)
}

func (d cgroupDevices) Processes(ctx context.Context, parent, name string) ([]int, error) {
	c, err := d.at(parent)
	if err != nil {
		return nil, err
	}
	return c.Processes(ctx, name)
}

func (d cgroupDevices) Destroy(ctx context.Context, parent, name string) error {
	c, err := d.at(parent)
	if err != nil {
		return err
	}
	return c.Destroy(ctx, name)
}

func (d cgroupDevices) Owners(ctx context.Context, parent string) ([]string, error) {
	c, err := d.at(parent)
	if err != nil {
		return nil, err
	}
	return c.Owners(ctx)
}

func (d cgroupDevices) RemoveParent(parent string) error {
	c, err := d.at(parent)
	if err != nil {
		return err
	}
	return c.RemoveParent()
}

func (d cgroupDevices) SetCPUs(ctx context.Context, parent, name, cpus, mems string) error {
	c, err := d.at(parent)
	if err != nil {
		return err
	}
	return c.SetCPUs(ctx, name, cpus, mems)
}

func (d cgroupDevices) Version() cgroups.Version { return d.base.Version() }
