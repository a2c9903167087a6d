package conformance

// The sampler: which live containers may open which GPU device nodes, read
// from each container's device cgroup (cgroup v1's devices.list, or on a
// cgroup2-only host the device programs in force for its cgroup), checked
// against one another and against the allocator's state. It reads only
// what any root process can see (/proc, cgroups, BPF programs, a state
// file), so that suites of other packages check with it too.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// cgroupRoot is where the cgroup v1 hierarchies are mounted, or the
// unified hierarchy on a cgroup2-only host.
const cgroupRoot = "/sys/fs/cgroup"

// AllGPUs stands for every GPU in a set of GPU minors: a rule that allows
// any minor of the GPUs' major, or any device.
const AllGPUs = -1

// Proc is a process as /proc tells it apart from a later one with its pid.
type Proc struct {
	Pid   int
	Start uint64 // clock ticks after boot; 0 when unknown
}

// stat reads a process's state letter and start time.
func stat(pid int) (state string, start uint64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 {
		return "", 0, false
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return f[0], start, err == nil
}

// Alive reports whether p still runs (and is no zombie).
func (p Proc) Alive() bool {
	st, start, ok := stat(p.Pid)
	if !ok || st == "Z" || st == "X" {
		return false
	}
	return p.Start == 0 || start == p.Start
}

// ProcOf names the process pid now runs.
func ProcOf(pid int) Proc {
	_, start, _ := stat(pid)
	return Proc{Pid: pid, Start: start}
}

// CgroupsOf reads the cgroup paths of pid by hierarchy ("devices", "cpu",
// ...), from each hierarchy's root; on a cgroup2-only host the one
// hierarchy's is under "" (on a hybrid host cgroup2's is left out: it
// holds no controller).
func CgroupsOf(pid int) map[string]string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return nil
	}
	out := map[string]string{}
	unified := testenv.CgroupV2Only()
	for l := range strings.Lines(string(b)) {
		f := strings.SplitN(strings.TrimSpace(l), ":", 3)
		if len(f) == 3 && f[0] == "0" && f[1] == "" && unified {
			out[""] = f[2]
			continue
		}
		if len(f) != 3 || f[1] == "" {
			continue
		}
		for _, ctl := range strings.Split(f[1], ",") {
			out[ctl] = f[2]
		}
	}
	return out
}

// gpusAllowedV1 reads the v1 device cgroup of pid and returns the minors
// of the NVIDIA GPU nodes it allows to be read or written ({AllGPUs} for a
// rule that allows them all) and the cgroup's path. The GPUs' major is the
// one whose minor 255 (nvidiactl) is allowed; GPUs are its minors below 254
// (nvidia-modeset). ok is false where pid is in no device cgroup of its
// own (not yet moved, or gone).
func gpusAllowedV1(pid int) (minors []int, path string, ok bool) {
	path = CgroupsOf(pid)["devices"]
	if path == "" || path == "/" {
		return nil, path, false
	}
	b, err := os.ReadFile(filepath.Join(cgroupRoot, "devices", path, "devices.list"))
	if err != nil {
		return nil, path, false
	}
	return gpuMinors(string(b)), path, true
}

// gpuMinors reads a devices.list: the minors of the GPU nodes it allows.
func gpuMinors(list string) []int {
	type rule struct {
		kind, major, minor string
	}
	var rules []rule
	majors := map[string]bool{}
	for l := range strings.Lines(list) {
		f := strings.Fields(l)
		if len(f) != 3 || !strings.ContainsAny(f[2], "rw") {
			continue
		}
		maj, min, _ := strings.Cut(f[1], ":")
		rules = append(rules, rule{f[0], maj, min})
		if f[0] == "c" && min == "255" {
			majors[maj] = true
		}
	}
	var minors []int
	for _, r := range rules {
		switch {
		case r.kind == "a", r.kind == "c" && r.major == "*":
			return []int{AllGPUs}
		case r.kind != "c" || !majors[r.major]:
		case r.minor == "*":
			return []int{AllGPUs}
		default:
			if n, err := strconv.Atoi(r.minor); err == nil && n < 254 {
				minors = append(minors, n)
			}
		}
	}
	slices.Sort(minors)
	return minors
}

// GPUsAllowed returns the reader of the GPU minors a container's device
// cgroup (its first process's) allows to be read or written, on this host, for a node whose GPUs
// are minors on major: cgroup v1's devices.list, or on a cgroup2-only host
// the device programs in force for the process's cgroup, run for each
// minor. The reader returns the minors ({AllGPUs} for a rule that allows
// every one), the cgroup's path, and false where the container's process
// is in no device cgroup of its own (not yet moved, gone, or not yet
// confined).
func GPUsAllowed(major uint32, minors []int) func(c Container) (allowed []int, path string, ok bool) {
	if !testenv.CgroupV2Only() {
		return func(c Container) ([]int, string, bool) { return gpusAllowedV1(c.Proc.Pid) }
	}
	minors = slices.Sorted(slices.Values(minors))
	spare := uint32(0) // a minor of no GPU, below nvidia-modeset's
	for slices.Contains(minors, int(spare)) {
		spare++
	}
	return func(c Container) ([]int, string, bool) { return gpusAllowedV2(c.Proc.Pid, major, minors, spare) }
}

// Container is a live container: its id and its first process.
type Container struct {
	ID   string
	Proc Proc
}

// Watch says what a Sampler watches.
type Watch struct {
	// Live lists the live containers.
	Live func() ([]Container, error)
	// Held reads the GPU minors the allocator holds for each container
	// id; nil where that is not checked.
	Held func() (map[string][]int, error)
	// GPUs reads the GPU minors a container's device cgroup allows (see
	// GPUsAllowed).
	GPUs func(c Container) (minors []int, path string, ok bool)
	// Every is the time between two samples.
	Every time.Duration
}

// Sampler watches live containers while something runs: no GPU may be
// allowed to two of them at once, and the allocator must hold every GPU a
// live container is allowed, for that container. It remembers every
// container it saw running, its first process and its cgroups, for a check
// that nothing of them is left.
type Sampler struct {
	w Watch

	mu       sync.Mutex
	failures []string
	seen     map[string]bool   // containers seen running
	procs    map[Proc]string   // their first processes
	cgroups  map[string]string // their cgroup directories (absolute)
	own      map[string]string // this process's cgroups, which containers may inherit
	stop     chan struct{}
	done     chan struct{}
}

// NewSampler returns a sampler of w; it samples once Start is called, or
// at each Sample.
func NewSampler(w Watch) *Sampler {
	return &Sampler{w: w, seen: map[string]bool{}, procs: map[Proc]string{}, cgroups: map[string]string{}, own: CgroupsOf(os.Getpid())}
}

// Start samples every w.Every until Finish.
func (s *Sampler) Start() {
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(s.done)
		for {
			s.Sample()
			select {
			case <-s.stop:
				return
			case <-time.After(s.w.Every):
			}
		}
	}()
}

// Finish stops sampling (one last sample first) and returns the failures
// of every sample.
func (s *Sampler) Finish() []string {
	if s.stop != nil {
		close(s.stop)
		<-s.done
		s.stop = nil
	}
	s.Sample()
	return s.Failures()
}

// Failures returns the failures seen so far.
func (s *Sampler) Failures() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.failures)
}

// Sample takes one look at the live containers.
func (s *Sampler) Sample() {
	live, err := s.w.Live()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.failures = append(s.failures, fmt.Sprintf("list live containers: %v", err))
		return
	}
	holder := map[int]string{}
	uses := map[string][]int{}
	var alive []Container
	for _, c := range live {
		minors, path, ok := s.w.GPUs(c)
		if !ok || !c.Proc.Alive() {
			continue // not isolated yet, or gone since the listing
		}
		uses[c.ID] = minors
		alive = append(alive, c)
		s.seen[c.ID] = true
		s.procs[c.Proc] = c.ID
		for ctl, p := range CgroupsOf(c.Proc.Pid) {
			if p != "/" && p != "" && p != s.own[ctl] {
				s.cgroups[filepath.Join(cgroupRoot, ctl, p)] = c.ID
			}
		}
		for _, m := range minors {
			for other, id := range holder {
				if id != c.ID && (other == m || other == AllGPUs || m == AllGPUs) {
					s.failures = append(s.failures, fmt.Sprintf("GPU minor %s allowed to live containers %s and %s at once (%s)", minorName(m), id, c.ID, path))
				}
			}
			holder[m] = c.ID
		}
	}
	if s.w.Held == nil || len(alive) == 0 {
		return
	}
	// The allocator holds, for each container that still runs after its
	// state was read, every GPU its device cgroup allows.
	held, err := s.w.Held()
	if err != nil {
		s.failures = append(s.failures, fmt.Sprintf("read the allocator's state: %v", err))
		return
	}
	for _, c := range alive {
		var free []string
		for _, m := range uses[c.ID] {
			if !slices.Contains(held[c.ID], m) {
				free = append(free, minorName(m))
			}
		}
		if len(free) > 0 && c.Proc.Alive() {
			s.failures = append(s.failures, fmt.Sprintf("live container %s is allowed GPU minors %v, which the allocator does not hold for it (it holds %v)", c.ID, free, held[c.ID]))
		}
	}
}

func minorName(m int) string {
	if m == AllGPUs {
		return "*"
	}
	return strconv.Itoa(m)
}

// SeenRunning returns how many containers the sampler saw running.
func (s *Sampler) SeenRunning() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

// Leftovers lists what is left of the containers the sampler saw, other
// than those of keep (still running by design): processes and cgroups.
func (s *Sampler) Leftovers(keep map[string]bool) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var left []string
	for p, id := range s.procs {
		if !keep[id] && p.Alive() {
			left = append(left, fmt.Sprintf("process %d of container %s", p.Pid, id))
		}
	}
	for dir, id := range s.cgroups {
		if keep[id] {
			continue
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			left = append(left, fmt.Sprintf("cgroup %s of container %s", dir, id))
		}
	}
	slices.Sort(left)
	return left
}

// Allocations reads what the allocator's state file in dir records each
// owner as holding (allocator.ReadHoldings): the UUIDs of the whole GPUs
// it holds, by owner (none, and no error, without a file).
func Allocations(dir string) (map[string][]string, error) {
	holdings, err := allocator.ReadHoldings(dir)
	if err != nil {
		return nil, err
	}
	if holdings == nil {
		return nil, nil
	}
	out := map[string][]string{}
	for _, h := range holdings {
		out[h.Owner] = []string{}
		for _, d := range h.Devices {
			out[h.Owner] = append(out[h.Owner], d.UUID)
		}
	}
	return out, nil
}

// HeldIn returns the reader of the GPU minors the allocator whose state
// file is in dir holds for each owner, the minors being minorOf's (by
// UUID); a device of no GPU of the node matches no minor.
func HeldIn(dir string, minorOf map[string]int) func() (map[string][]int, error) {
	return func() (map[string][]int, error) {
		byUUID, err := Allocations(dir)
		out := map[string][]int{}
		for o, uuids := range byUUID {
			for _, u := range uuids {
				m, ok := minorOf[u]
				if !ok {
					m = AllGPUs - 1 // no GPU of the node: matches nothing
				}
				out[o] = append(out[o], m)
			}
		}
		return out, err
	}
}
