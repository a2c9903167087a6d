package conformance

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// The device cgroup's view of an access (struct bpf_cgroup_dev_ctx): the
// device type and the access in one word, then the numbers.
const (
	devBlock = 1 // BPF_DEVCG_DEV_BLOCK
	devChar  = 2 // BPF_DEVCG_DEV_CHAR
	accMknod = 1 // BPF_DEVCG_ACC_MKNOD
	accRead  = 2 // BPF_DEVCG_ACC_READ
	accWrite = 4 // BPF_DEVCG_ACC_WRITE
)

// queryEffective is BPF_F_QUERY_EFFECTIVE: the programs that run for a
// cgroup, its ancestors' included.
const queryEffective = 1

// errUnknownInstruction: a device program uses an instruction the
// evaluator does not know; the sampler reports it rather than guess.
var errUnknownInstruction = errors.New("device program: instruction the evaluator does not know")

// evalDeviceProgram runs a cgroup device program (the kernel's translated
// instructions, jumps as raw offsets) on one access, as the kernel would:
// it returns the program's verdict, true for allow. Only what a device
// filter needs is known: loads from the context, ALU operations on
// registers and constants, conditional jumps and exit.
func evalDeviceProgram(insns asm.Instructions, typ, access, major, minor uint32) (bool, error) {
	// The context as the program reads it: three little-endian words.
	var ctx [12]byte
	binary.LittleEndian.PutUint32(ctx[0:], access<<16|typ)
	binary.LittleEndian.PutUint32(ctx[4:], major)
	binary.LittleEndian.PutUint32(ctx[8:], minor)
	sizes := map[asm.Size]int{asm.Byte: 1, asm.Half: 2, asm.Word: 4}
	// Raw instruction offsets (a 64-bit constant load takes two) to
	// indexes, for the jumps.
	index := map[uint64]int{}
	var raw uint64
	for i, ins := range insns {
		index[raw] = i
		raw += ins.Size() / asm.InstructionSize
	}
	var reg [11]uint64
	isCtx := [11]bool{asm.R1: true} // R1 holds the context pointer
	for pc, steps := 0, 0; pc < len(insns); steps++ {
		if steps > 4096 {
			return false, fmt.Errorf("device program runs past 4096 steps: %w", errUnknownInstruction)
		}
		ins := insns[pc]
		op := ins.OpCode
		next := pc + 1
		switch op.Class() {
		case asm.LdXClass:
			n, off := sizes[op.Size()], int(ins.Offset)
			if op.Mode() != asm.MemMode || n == 0 || !isCtx[ins.Src] || off < 0 || off+n > len(ctx) {
				return false, fmt.Errorf("%v: %w", ins, errUnknownInstruction)
			}
			var v uint64
			for i := n - 1; i >= 0; i-- {
				v = v<<8 | uint64(ctx[off+i])
			}
			reg[ins.Dst], isCtx[ins.Dst] = v, false
		case asm.LdClass:
			if !ins.IsConstantLoad(asm.DWord) {
				return false, fmt.Errorf("%v: %w", ins, errUnknownInstruction)
			}
			reg[ins.Dst], isCtx[ins.Dst] = uint64(ins.Constant), false
		case asm.ALUClass, asm.ALU64Class:
			src := uint64(ins.Constant)
			if op.Source() == asm.RegSource {
				src = reg[ins.Src]
			}
			if op.ALUOp() == asm.Mov && op.Source() == asm.RegSource {
				isCtx[ins.Dst] = isCtx[ins.Src]
			} else {
				isCtx[ins.Dst] = false
			}
			d := reg[ins.Dst]
			switch op.ALUOp() {
			case asm.Mov:
				d = src
			case asm.Add:
				d += src
			case asm.Sub:
				d -= src
			case asm.And:
				d &= src
			case asm.Or:
				d |= src
			case asm.Xor:
				d ^= src
			case asm.LSh:
				d <<= src & 63
			case asm.RSh:
				if op.Class() == asm.ALUClass {
					d = uint64(uint32(d) >> (src & 31))
				} else {
					d >>= src & 63
				}
			default:
				return false, fmt.Errorf("%v: %w", ins, errUnknownInstruction)
			}
			if op.Class() == asm.ALUClass {
				d = uint64(uint32(d))
			}
			reg[ins.Dst] = d
		case asm.JumpClass, asm.Jump32Class:
			if op.JumpOp() == asm.Exit {
				return reg[asm.R0] != 0, nil
			}
			a, b := reg[ins.Dst], uint64(ins.Constant)
			if op.Source() == asm.RegSource {
				b = reg[ins.Src]
			}
			if op.Class() == asm.Jump32Class {
				a, b = uint64(uint32(a)), uint64(uint32(b))
			}
			var taken bool
			switch op.JumpOp() {
			case asm.Ja:
				taken = true
			case asm.JEq:
				taken = a == b
			case asm.JNE:
				taken = a != b
			case asm.JGT:
				taken = a > b
			case asm.JGE:
				taken = a >= b
			case asm.JLT:
				taken = a < b
			case asm.JLE:
				taken = a <= b
			case asm.JSet:
				taken = a&b != 0
			default:
				return false, fmt.Errorf("%v: %w", ins, errUnknownInstruction)
			}
			if taken {
				var here uint64
				for i := range pc {
					here += insns[i].Size() / asm.InstructionSize
				}
				to := int64(here) + 1 + int64(ins.Offset)
				j, ok := index[uint64(to)]
				if to < 0 || !ok {
					return false, fmt.Errorf("%v: jump to %d: %w", ins, to, errUnknownInstruction)
				}
				next = j
			}
		default:
			return false, fmt.Errorf("%v: %w", ins, errUnknownInstruction)
		}
		pc = next
	}
	return false, fmt.Errorf("device program runs off its end: %w", errUnknownInstruction)
}

// devicePrograms reads the device programs in force for the cgroup2
// directory dir (its own and its ancestors'): every one must allow an
// access. None means the cgroup is not confined.
func devicePrograms(dir string) ([]asm.Instructions, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	res, err := link.QueryPrograms(link.QueryOptions{Target: int(d.Fd()), Attach: ebpf.AttachCGroupDevice, QueryFlags: queryEffective})
	if err != nil {
		return nil, fmt.Errorf("device programs of %s: %w", dir, err)
	}
	var out []asm.Instructions
	for _, p := range res.Programs {
		prog, err := ebpf.NewProgramFromID(p.ID)
		if err != nil {
			return nil, fmt.Errorf("device program %d of %s: %w", p.ID, dir, err)
		}
		info, err := prog.Info()
		prog.Close()
		if err != nil {
			return nil, fmt.Errorf("device program %d of %s: %w", p.ID, dir, err)
		}
		insns, err := info.Instructions()
		if err != nil {
			return nil, fmt.Errorf("device program %d of %s: %w", p.ID, dir, err)
		}
		out = append(out, insns)
	}
	return out, nil
}

// programMinors returns the GPU minors (of the GPUs' major) that progs
// allow to be read or written, all of them together; a minor of no GPU
// that is allowed too means a rule for every minor ({AllGPUs}).
func programMinors(progs []asm.Instructions, major uint32, gpuMinors []int, spare uint32) ([]int, error) {
	allowed := func(minor uint32) (bool, error) {
		for _, acc := range []uint32{accRead, accWrite} {
			ok := true
			for _, p := range progs {
				v, err := evalDeviceProgram(p, devChar, acc, major, minor)
				if err != nil {
					return false, err
				}
				ok = ok && v
			}
			if ok {
				return true, nil
			}
		}
		return false, nil
	}
	if ok, err := allowed(spare); err != nil || ok {
		return []int{AllGPUs}, err
	}
	var out []int
	for _, m := range gpuMinors {
		ok, err := allowed(uint32(m))
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, m)
		}
	}
	return out, nil
}

// gpusAllowedV2 is gpusAllowedV1 on a cgroup2-only host: pid's cgroup, the
// device programs in force for it, and the GPU minors they allow. ok is
// false where pid is in no cgroup of its own or one with no device
// program yet (the agent makes its cgroup before the GPU isolator confines
// it).
func gpusAllowedV2(pid int, major uint32, gpuMinors []int, spare uint32) (minors []int, path string, ok bool) {
	path = CgroupsOf(pid)[""]
	if path == "" || path == "/" {
		return nil, path, false
	}
	progs, err := devicePrograms(filepath.Join(cgroupRoot, path))
	if err != nil || len(progs) == 0 {
		return nil, path, false
	}
	minors, err = programMinors(progs, major, gpuMinors, spare)
	if err != nil {
		// An evaluator that cannot read the program must not pass a check
		// silently: the minor AllGPUs collides with every other container.
		return []int{AllGPUs}, path + " (" + err.Error() + ")", true
	}
	return minors, path, true
}
