package cgroups

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
)

// xattrName is the extended attribute of a v2 cgroup directory holding the
// applied rules and the id of the device program enforcing them.
const xattrName = "trusted.gpuiso.devices"

type v2State struct {
	Program uint32   `json:"program"`
	Rules   []string `json:"rules"`
}

// Program builds the eBPF device program that allows exactly rules: the
// pure half of the v2 back end, testable without privileges.
func Program(rules []isolator.Rule) (*ebpf.ProgramSpec, error) {
	// A leading deny-all, then the allows: the filter checks the last rule
	// first and denies what no rule matches.
	list := []specs.LinuxDeviceCgroup{isolator.Rule{Type: 'a', Major: isolator.Wildcard, Minor: isolator.Wildcard, Access: "rwm"}.LinuxDeviceCgroup()}
	for _, r := range isolator.Canonical(rules) {
		if err := r.Validate(); err != nil {
			return nil, err
		}
		list = append(list, r.LinuxDeviceCgroup())
	}
	insts, license, err := cgroup2.DeviceFilter(list)
	if err != nil {
		return nil, fmt.Errorf("build device program: %w", err)
	}
	return &ebpf.ProgramSpec{Type: ebpf.CGroupDevice, Instructions: insts, License: license}, nil
}

// applyV2 loads a program for rules and attaches it to owner's cgroup,
// replacing the program it had (one atomic step), then records the rules.
func (i *Isolator) applyV2(owner string, want []isolator.Rule) error {
	dir := i.Path(owner)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	spec, err := Program(want)
	if err != nil {
		return err
	}
	prog, err := ebpf.NewProgram(spec)
	if err != nil {
		return fmt.Errorf("load device program: %w", err)
	}
	defer prog.Close() // once attached, the cgroup holds it
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()

	opts := link.RawAttachProgramOptions{Target: int(d.Fd()), Program: prog, Attach: ebpf.AttachCGroupDevice, Flags: linux.BPFFAllowMulti}
	old, err := i.attachedOwn(owner, int(d.Fd()))
	if err != nil {
		return err
	}
	if old != nil {
		defer old.Close()
		opts.Anchor = link.ReplaceProgram(old)
	}
	if err := link.RawAttachProgram(opts); err != nil {
		return fmt.Errorf("attach device program: %w", err)
	}
	info, err := prog.Info()
	if err != nil {
		return err
	}
	id, _ := info.ID()
	st := v2State{Program: uint32(id)}
	for _, r := range want {
		st.Rules = append(st.Rules, r.String())
	}
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return linux.SetXattr(dir, xattrName, b)
}

// attachedOwn returns the program this isolator attached to the cgroup
// before, if it is still attached.
func (i *Isolator) attachedOwn(owner string, fd int) (*ebpf.Program, error) {
	st, err := i.stateV2(owner)
	if errors.Is(err, linux.ErrNoXattr) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: ebpf.AttachCGroupDevice})
	if err != nil {
		return nil, fmt.Errorf("query device programs: %w", err)
	}
	for _, p := range res.Programs {
		if uint32(p.ID) == st.Program {
			return ebpf.NewProgramFromID(p.ID)
		}
	}
	return nil, nil
}

func (i *Isolator) stateV2(owner string) (v2State, error) {
	var st v2State
	b, err := linux.GetXattr(i.Path(owner), xattrName)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s of %s: %w", xattrName, owner, err)
	}
	return st, nil
}

func (i *Isolator) rulesV2(owner string) ([]isolator.Rule, error) {
	st, err := i.stateV2(owner)
	if errors.Is(err, linux.ErrNoXattr) {
		return nil, nil // created, never confined
	}
	if err != nil {
		return nil, err
	}
	var rules []isolator.Rule
	for _, s := range st.Rules {
		r, err := isolator.ParseRule(s)
		if err != nil {
			return nil, fmt.Errorf("%s of %s: %w", xattrName, owner, err)
		}
		rules = append(rules, r)
	}
	return isolator.Canonical(rules), nil
}

// Programs counts the device programs attached to owner's cgroup (v2 only):
// one after any number of updates.
func (i *Isolator) Programs(ctx context.Context, owner string) (int, error) {
	if i.mount == "" {
		return 0, ErrNotMade
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if i.version != V2 {
		return 0, fmt.Errorf("device programs: cgroup %s: %w", i.version, isolator.ErrNotSupported)
	}
	d, err := os.Open(filepath.Join(i.Path(owner)))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("device programs of %s: %w", owner, isolator.ErrUnknownContainer)
	}
	if err != nil {
		return 0, err
	}
	defer d.Close()
	res, err := link.QueryPrograms(link.QueryOptions{Target: int(d.Fd()), Attach: ebpf.AttachCGroupDevice})
	if err != nil {
		return 0, fmt.Errorf("query device programs: %w", err)
	}
	return len(res.Programs), nil
}

// OpenCgroup opens owner's cgroup2 directory, for starting a process
// directly inside it (clone3 with CLONE_INTO_CGROUP: Go's
// SysProcAttr.UseCgroupFD), which is faster than moving it in afterwards and
// leaves no moment outside. Only for V2; the caller closes the file.
func (i *Isolator) OpenCgroup(owner string) (*os.File, error) {
	if i.mount == "" {
		return nil, ErrNotMade
	}
	if i.version != V2 {
		return nil, fmt.Errorf("open cgroup: cgroup %s: %w", i.version, isolator.ErrNotSupported)
	}
	if err := node.ValidateOwner(owner); err != nil {
		return nil, err
	}
	f, err := os.Open(i.Path(owner))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("open cgroup of %s: %w", owner, isolator.ErrUnknownContainer)
	}
	return f, err
}
