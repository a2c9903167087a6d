package conformance

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The suite's own checks fail where they must: these need nothing of the
// host.

func TestGPUMinors(t *testing.T) {
	const pseudo = "b *:* m\nc *:* m\nc 1:3 rwm\nc 5:0 rwm\nc 136:* rwm\n"
	for _, tc := range []struct {
		name string
		list string
		want []int
	}{
		{"two GPUs", pseudo + "c 240:2 rwm\nc 240:3 rwm\nc 240:255 rwm\nc 241:0 rwm\n", []int{2, 3}},
		{"no GPU", pseudo + "c 240:255 rwm\nc 241:0 rwm\n", nil},
		{"no control device: no GPU major", pseudo + "c 240:2 rwm\n", nil},
		{"mknod only", pseudo + "c 240:2 m\nc 240:255 rwm\n", nil},
		{"modeset is no GPU", pseudo + "c 195:254 rw\nc 195:255 rw\nc 195:0 r\n", []int{0}},
		{"every minor of the major", pseudo + "c 195:* rw\nc 195:255 rw\n", []int{AllGPUs}},
		{"every device", "a *:* rwm\n", []int{AllGPUs}},
		{"every character device", "c *:* rw\n", []int{AllGPUs}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := gpuMinors(tc.list); !slices.Equal(got, tc.want) {
				t.Errorf("gpuMinors = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSamplerSeesSharedGPUs(t *testing.T) {
	self := ProcOf(os.Getpid())
	for _, tc := range []struct {
		name string
		gpus map[string][]int // allowed by container
		held map[string][]int // by the allocator; nil: as allowed
		want string           // in the one failure; "" for none
	}{
		{"disjoint", map[string][]int{"a": {0, 1}, "b": {2, 3}}, nil, ""},
		{"one shared", map[string][]int{"a": {0, 1}, "b": {1, 2}}, nil, "GPU minor 1 allowed to live containers"},
		{"every GPU and one", map[string][]int{"a": {AllGPUs}, "b": {5}}, nil, "allowed to live containers"},
		{"one container", map[string][]int{"a": {0, 1, 2}}, nil, ""},
		{"held for more", map[string][]int{"a": {0}}, map[string][]int{"a": {0, 1}}, ""},
		{"not held", map[string][]int{"a": {0, 1}}, map[string][]int{"a": {0}}, "allowed GPU minors [1], which the allocator does not hold"},
		{"held for another", map[string][]int{"a": {3}}, map[string][]int{"b": {3}}, "allowed GPU minors [3], which the allocator does not hold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var live []Container
			for id := range tc.gpus {
				live = append(live, Container{ID: id, Proc: self})
			}
			slices.SortFunc(live, func(a, b Container) int { return strings.Compare(a.ID, b.ID) })
			s := NewSampler(Watch{
				Live: func() ([]Container, error) { return live, nil },
				GPUs: func(c Container) ([]int, string, bool) { return tc.gpus[c.ID], "/test", true },
				Held: func() (map[string][]int, error) {
					if tc.held == nil {
						return tc.gpus, nil
					}
					return tc.held, nil
				},
			})
			s.Sample()
			failures := s.Failures()
			switch {
			case tc.want == "" && len(failures) != 0:
				t.Errorf("failures %q, want none", failures)
			case tc.want != "" && (len(failures) != 1 || !strings.Contains(failures[0], tc.want)):
				t.Errorf("failures %q, want one with %q", failures, tc.want)
			}
			if n := s.SeenRunning(); n != len(tc.gpus) {
				t.Errorf("saw %d containers running, want %d", n, len(tc.gpus))
			}
		})
	}
}

// TestLeftoversListed: what a dead run may leave in an instance's state is
// listed, one entry each.
func TestLeftoversListed(t *testing.T) {
	// An allocator's state file holding owner x-1: its envelope with the
	// checksum of the state's exact bytes.
	body := `{"owners":[{"owner":"x-1","devices":[{"index":0,"uuid":"GPU-0"}]}]}`
	sum := sha256.Sum256([]byte(body))
	owner := `{"format":"gpuiso.allocator.state","version":1,"checksum":"sha256:` + hex.EncodeToString(sum[:]) + `","state":` + body + `}`
	for _, tc := range []struct {
		name  string
		inst  func(t *testing.T, dir string) instance
		files map[string]string // under the state directory; "" for a directory
		want  []string
	}{
		{"native", func(t *testing.T, dir string) instance { return &nativeInstance{base: newBase(t, dir)} },
			map[string]string{"native/gpurun-1": "", "tmp/node-1": "", "allocations.json": owner, ".allocations.json.tmp": "x", "mps/.lock": "x", "mps/gpurun-2": ""},
			[]string{"state entry native/gpurun-1", "state entry tmp/node-1", "allocation of x-1", "state entry .allocations.json.tmp", "MPS daemon directory mps/gpurun-2"}},
		{"chain", func(t *testing.T, dir string) instance { return &chainInstance{base: newBase(t, dir)} },
			map[string]string{"containers/ct-1.json": "{}", "gpu/ct-1.json": "{}", "gpu/.lock": "", "alloc/allocations.json": owner},
			[]string{"record containers/ct-1.json", "GPU isolator record gpu/ct-1.json", "allocation of x-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			inst := tc.inst(t, dir)
			if left := inst.leftovers(nil, nil); len(left) != 0 {
				t.Fatalf("an empty instance: left %q", left)
			}
			state := filepath.Join(dir, "state")
			for name, body := range tc.files {
				p := filepath.Join(state, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				var err error
				if body == "" && !strings.Contains(name, ".") {
					err = os.Mkdir(p, 0o755)
				} else {
					err = os.WriteFile(p, []byte(body), 0o644)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(dir, "tmp", "gpuiso-node-1"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			left := inst.leftovers(nil, nil)
			for _, w := range append(tc.want, "TMPDIR entry gpuiso-node-1") {
				if !slices.Contains(left, w) {
					t.Errorf("%q not listed in %q", w, left)
				}
			}
			if len(left) != len(tc.want)+1 {
				t.Errorf("left %q, want %d entries", left, len(tc.want)+1)
			}
		})
	}
}

// TestParentLeft: a cgroup parent is left when it holds a cgroup that is
// not a neighbour's, or when it is empty and no neighbour keeps it.
func TestParentLeft(t *testing.T) {
	for _, tc := range []struct {
		name     string
		children []string // "": the parent itself, empty
		skip     []string
		want     []string
	}{
		{"gone", nil, nil, nil},
		{"empty", []string{""}, nil, []string{"cgroup parent P without containers"}},
		{"a container", []string{"gpurun-1"}, nil, []string{"cgroup P/gpurun-1"}},
		{"a neighbour", []string{"nest"}, []string{"P/nest"}, nil},
		{"a neighbour and a container", []string{"nest", "ct-1"}, []string{"P/nest"}, []string{"cgroup P/ct-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := filepath.Join(t.TempDir(), "parent")
			for _, c := range tc.children {
				if err := os.MkdirAll(filepath.Join(parent, c), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			var skip, want []string
			for _, s := range tc.skip {
				skip = append(skip, strings.Replace(s, "P", parent, 1))
			}
			for _, w := range tc.want {
				want = append(want, strings.Replace(w, "P", parent, 1))
			}
			if got := parentLeft(parent, skip); !slices.Equal(got, want) {
				t.Errorf("parentLeft = %q, want %q", got, want)
			}
		})
	}
}
