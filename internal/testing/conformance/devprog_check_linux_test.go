package conformance

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"

	"github.com/cilium/ebpf/asm"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
)

// kernelForm returns the device program of rules as the kernel holds it:
// the pure builder's instructions, encoded (jumps resolved to raw offsets)
// and decoded again.
func kernelForm(t *testing.T, rules []isolator.Rule) asm.Instructions {
	t.Helper()
	spec, err := cgroups.Program(rules)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := spec.Instructions.Marshal(&buf, binary.LittleEndian); err != nil {
		t.Fatal(err)
	}
	insns, err := asm.AppendInstructions(nil, &buf, binary.LittleEndian, "linux")
	if err != nil {
		t.Fatal(err)
	}
	return insns
}

// TestEvalDeviceProgram runs the evaluator the cgroup2 sampler uses on
// the programs of known rules: every access the rules allow is allowed,
// every other denied, for character and block devices and each access.
func TestEvalDeviceProgram(t *testing.T) {
	const major = 240
	rules := append(isolator.DefaultRules(), isolator.Allow(major, 1, "rwm"), isolator.Allow(major, 3, "rw"), isolator.Allow(major, 255, "rwm"))
	prog := kernelForm(t, rules)
	for _, tc := range []struct {
		name                string
		typ, acc, maj, mino uint32
		want                bool
	}{
		{"own GPU read", devChar, accRead, major, 1, true},
		{"own GPU write", devChar, accWrite, major, 3, true},
		{"own GPU mknod (c *:* m)", devChar, accMknod, major, 3, true},
		{"other GPU", devChar, accRead, major, 2, false},
		{"nvidiactl", devChar, accWrite, major, 255, true},
		{"/dev/null", devChar, accRead, 1, 3, true},
		{"any char mknod (c *:* m)", devChar, accMknod, 77, 9, true},
		{"any block mknod (b *:* m)", devBlock, accMknod, 8, 0, true},
		{"a block device read", devBlock, accRead, 8, 0, false},
		{"pts", devChar, accRead, 136, 42, true},
	} {
		got, err := evalDeviceProgram(prog, tc.typ, tc.acc, tc.maj, tc.mino)
		if err != nil || got != tc.want {
			t.Errorf("%s: %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

// TestProgramMinors: the GPU minors a program allows, as the sampler reads
// them; a program with one allowed GPU's rule taken out (a broken rule) no
// longer allows that GPU, and a rule for every minor is every GPU.
func TestProgramMinors(t *testing.T) {
	const major = 240
	gpus := []int{0, 1, 2, 3}
	for _, tc := range []struct {
		name  string
		rules []isolator.Rule
		want  []int
	}{
		{"GPUs 1 and 3", []isolator.Rule{isolator.Allow(major, 1, "rwm"), isolator.Allow(major, 3, "rwm"), isolator.Allow(major, 255, "rwm")}, []int{1, 3}},
		{"GPU 3's rule taken out", []isolator.Rule{isolator.Allow(major, 1, "rwm"), isolator.Allow(major, 255, "rwm")}, []int{1}},
		{"no GPU", []isolator.Rule{isolator.Allow(major, 255, "rwm")}, nil},
		{"every minor", []isolator.Rule{isolator.Allow(major, isolator.Wildcard, "rw")}, []int{AllGPUs}},
	} {
		prog := kernelForm(t, append(isolator.DefaultRules(), tc.rules...))
		got, err := programMinors([]asm.Instructions{prog}, major, gpus, 4)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	// Two programs in force (a parent's and the cgroup's own): both must
	// allow.
	both := []asm.Instructions{
		kernelForm(t, append(isolator.DefaultRules(), isolator.Allow(major, 1, "rwm"), isolator.Allow(major, 3, "rwm"))),
		kernelForm(t, append(isolator.DefaultRules(), isolator.Allow(major, 3, "rwm"))),
	}
	if got, err := programMinors(both, major, gpus, 4); err != nil || !slices.Equal(got, []int{3}) {
		t.Errorf("two programs: %v, %v; want [3]", got, err)
	}
}
