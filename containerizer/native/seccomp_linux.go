package native

import (
	"fmt"
	"math/bits"
	"sync"

	bpf "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"
	netbpf "golang.org/x/net/bpf"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// seccompPolicy is Docker's default seccomp profile for a container whose
// bounding set holds caps (names such as "CAP_SYS_ADMIN"), as a BPF policy
// for the machine's own architecture. Syscalls that the profile allows but
// the compiler's table does not know are left out (they get EPERM), and so
// are other architectures' ABIs (32-bit calls on x86-64 get EPERM, x32 ones
// ENOSYS).
func seccompPolicy(caps []string) (*bpf.Policy, error) {
	rs := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps}}}
	prof, err := seccomp.GetDefaultProfile(rs)
	if err != nil {
		return nil, fmt.Errorf("seccomp profile: %w", err)
	}
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp profile: %w", err)
	}
	def, err := seccompAction(prof.DefaultAction, prof.DefaultErrnoRet)
	if err != nil {
		return nil, err
	}
	pol := &bpf.Policy{DefaultAction: def}
	for _, sc := range prof.Syscalls {
		act, err := seccompAction(sc.Action, sc.ErrnoRet)
		if err != nil {
			return nil, err
		}
		if act == def {
			continue
		}
		conds, err := seccompConditions(sc.Args)
		if err != nil {
			return nil, fmt.Errorf("seccomp profile: %v: %w", sc.Names, err)
		}
		g := bpf.SyscallGroup{Action: act}
		for _, name := range sc.Names {
			if _, ok := info.SyscallNames[name]; !ok {
				continue
			}
			if conds == nil {
				g.Names = append(g.Names, name)
				continue
			}
			for _, c := range conds {
				g.NamesWithCondtions = append(g.NamesWithCondtions, bpf.NameWithConditions{Name: name, Conditions: c})
			}
		}
		if len(g.Names)+len(g.NamesWithCondtions) > 0 {
			pol.Syscalls = append(pol.Syscalls, g)
		}
	}
	return pol, nil
}

func seccompAction(a specs.LinuxSeccompAction, errno *uint) (bpf.Action, error) {
	switch a {
	case specs.ActAllow:
		return bpf.ActionAllow, nil
	case specs.ActErrno:
		if errno == nil || *errno == 0 || *errno == 1 {
			return bpf.ActionErrno, nil // EPERM
		}
		return bpf.ActionErrno | bpf.Action(*errno&0xffff), nil
	}
	return 0, fmt.Errorf("seccomp profile: action %s is not supported", a)
}

// seccompConditions turns a rule's argument checks into alternatives, each a
// list of checks that must all hold: one alternative when the checks name
// different arguments, one per check when they all name the same one (as
// runc reads a profile).
func seccompConditions(args []specs.LinuxSeccompArg) ([]bpf.ArgumentConditions, error) {
	if len(args) == 0 {
		return nil, nil
	}
	var conds []bpf.Condition
	sameIndex := true
	for _, a := range args {
		c, err := seccompCondition(a)
		if err != nil {
			return nil, err
		}
		conds = append(conds, c)
		sameIndex = sameIndex && a.Index == args[0].Index
	}
	if !sameIndex || len(conds) == 1 {
		return []bpf.ArgumentConditions{conds}, nil
	}
	out := make([]bpf.ArgumentConditions, len(conds))
	for i, c := range conds {
		out[i] = bpf.ArgumentConditions{c}
	}
	return out, nil
}

func seccompCondition(a specs.LinuxSeccompArg) (bpf.Condition, error) {
	c := bpf.Condition{Argument: uint32(a.Index), Value: a.Value}
	switch a.Op {
	case specs.OpEqualTo:
		c.Operation = bpf.Equal
	case specs.OpNotEqual:
		c.Operation = bpf.NotEqual
	case specs.OpLessThan:
		c.Operation = bpf.LessThan
	case specs.OpLessEqual:
		c.Operation = bpf.LessOrEqual
	case specs.OpGreaterThan:
		c.Operation = bpf.GreaterThan
	case specs.OpGreaterEqual:
		c.Operation = bpf.GreaterOrEqual
	case specs.OpMaskedEqual:
		// (arg & Value) == ValueTwo: "no bit of Value" or "the one bit of Value".
		switch {
		case a.ValueTwo == 0:
			c.Operation = bpf.BitsNotSet
		case a.ValueTwo == a.Value && bits.OnesCount64(a.Value) == 1:
			c.Operation = bpf.BitsSet
		default:
			return c, fmt.Errorf("masked comparison %#x == %#x is not supported", a.Value, a.ValueTwo)
		}
	default:
		return c, fmt.Errorf("comparison %s is not supported", a.Op)
	}
	return c, nil
}

// seccompProgram is seccompPolicy assembled into the classic BPF program
// the kernel loads: what the containerizer builds once per capability set
// and hands every init in its config.
func seccompProgram(caps []string) ([]linux.SeccompInstruction, error) {
	policy, err := seccompPolicy(caps)
	if err != nil {
		return nil, err
	}
	insts, err := policy.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	raw, err := netbpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	prog := make([]linux.SeccompInstruction, len(raw))
	for i, r := range raw {
		prog[i] = linux.SeccompInstruction{Op: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return prog, nil
}

// programs caches the seccomp programs of a containerizer by capability
// set: Docker's profile is turned into BPF once per process, not per init.
type programs struct {
	mu    sync.Mutex
	byKey map[string][]linux.SeccompInstruction
}

func (p *programs) get(caps []int) ([]linux.SeccompInstruction, error) {
	key := fmt.Sprint(caps)
	p.mu.Lock()
	defer p.mu.Unlock()
	if prog, ok := p.byKey[key]; ok {
		return prog, nil
	}
	prog, err := seccompProgram(capNames(caps))
	if err != nil {
		return nil, err
	}
	if p.byKey == nil {
		p.byKey = map[string][]linux.SeccompInstruction{}
	}
	p.byKey[key] = prog
	return prog, nil
}
