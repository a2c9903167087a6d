package conformance

import (
	"bufio"
	"encoding/json"
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
	"github.com/gpuiso/gpuiso/internal/testenv"
)

// cgroupRoot is where the cgroup v1 hierarchies are mounted, or the
// unified hierarchy on a cgroup2-only host.
const cgroupRoot = "/sys/fs/cgroup"

// hierarchy is the directory of the cgroup hierarchy of controller ctl:
// its v1 hierarchy's, or on a cgroup2-only host the one hierarchy.
func hierarchy(ctl string) string {
	if testenv.CgroupV2Only() {
		return cgroupRoot
	}
	return filepath.Join(cgroupRoot, ctl)
}

// proc is a process as /proc tells it apart from a later one with its pid.
type proc struct {
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

// alive reports whether p still runs (and is no zombie).
func (p proc) alive() bool {
	st, start, ok := stat(p.Pid)
	if !ok || st == "Z" || st == "X" {
		return false
	}
	return p.Start == 0 || start == p.Start
}

// procOf names the process pid now runs.
func procOf(pid int) proc {
	_, start, _ := stat(pid)
	return proc{Pid: pid, Start: start}
}

// cgroupsOf reads the cgroup paths of pid by hierarchy ("devices", "cpu",
// ...), from each hierarchy's root; on a cgroup2-only host the one
// hierarchy's is under "" (on a hybrid host cgroup2's is left out: it
// holds no controller).
func cgroupsOf(pid int) map[string]string {
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

// allGPUs stands for every GPU in a set of GPU minors: a rule that allows
// any minor of the GPUs' major, or any device.
const allGPUs = -1

// gpusAllowed reads the device cgroup of pid and returns the minors of the
// NVIDIA GPU nodes it allows to be read or written ({allGPUs} for a rule
// that allows them all) and the cgroup's path. The GPUs' major is the one
// whose minor 255 (nvidiactl) is allowed; GPUs are its minors below 254
// (nvidia-modeset). ok is false where pid is in no device cgroup of its
// own (not yet moved, or gone).
func gpusAllowed(pid int) (minors []int, path string, ok bool) {
	path = cgroupsOf(pid)["devices"]
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
			return []int{allGPUs}
		case r.kind != "c" || !majors[r.major]:
		case r.minor == "*":
			return []int{allGPUs}
		default:
			if n, err := strconv.Atoi(r.minor); err == nil && n < 254 {
				minors = append(minors, n)
			}
		}
	}
	slices.Sort(minors)
	return minors
}

// container is a live container of an instance: its id and first process.
type container struct {
	ID   string
	Proc proc
}

// sampler watches an instance's live containers while runs go: no GPU may
// be allowed to two of them at once. It remembers every container it saw
// running, its processes and its cgroups, for the check that nothing of
// them is left.
type sampler struct {
	live func() ([]container, error)
	// held reads the GPU minors the allocator holds for each owner; nil
	// where it is not checked.
	held  func() (map[string][]int, error)
	gpus  func(c container) (minors []int, path string, ok bool)
	every time.Duration

	mu       sync.Mutex
	failures []string
	seen     map[string]bool   // containers seen running
	procs    map[proc]string   // their first processes
	cgroups  map[string]string // their cgroup directories (absolute)
	samples  int
	own      map[string]string // this process's cgroups, which containers may inherit
	stop     chan struct{}
	done     chan struct{}
}

// newSampler watches inst, whose node's GPUs have the minors minorOf (by
// UUID) on major.
func newSampler(inst instance, minorOf map[string]int, major uint32, every time.Duration) *sampler {
	gpus := func(c container) ([]int, string, bool) { return gpusAllowed(c.Proc.Pid) }
	if testenv.CgroupV2Only() {
		var minors []int
		for _, m := range minorOf {
			minors = append(minors, m)
		}
		slices.Sort(minors)
		spare := uint32(0) // a minor of no GPU, below nvidia-modeset's
		for slices.Contains(minors, int(spare)) {
			spare++
		}
		gpus = func(c container) ([]int, string, bool) { return gpusAllowedV2(c.Proc.Pid, major, minors, spare) }
	}
	held := func() (map[string][]int, error) {
		byUUID, err := allocations(inst.allocDir())
		out := map[string][]int{}
		for o, uuids := range byUUID {
			for _, u := range uuids {
				m, ok := minorOf[u]
				if !ok {
					m = allGPUs - 1 // no GPU of the node: matches nothing
				}
				out[o] = append(out[o], m)
			}
		}
		return out, err
	}
	return &sampler{live: inst.live, held: held, gpus: gpus, every: every, seen: map[string]bool{}, procs: map[proc]string{}, cgroups: map[string]string{}, own: cgroupsOf(os.Getpid())}
}

// start samples until finish.
func (s *sampler) start() {
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(s.done)
		for {
			s.sample()
			select {
			case <-s.stop:
				return
			case <-time.After(s.every):
			}
		}
	}()
}

// finish stops sampling (one last sample first) and returns the failures.
func (s *sampler) finish() []string {
	close(s.stop)
	<-s.done
	s.sample()
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.failures)
}

// sample takes one look at the instance's live containers.
func (s *sampler) sample() {
	live, err := s.live()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples++
	if err != nil {
		s.failures = append(s.failures, fmt.Sprintf("list live containers: %v", err))
		return
	}
	holder := map[int]string{}
	uses := map[string][]int{}
	var alive []container
	for _, c := range live {
		minors, path, ok := s.gpus(c)
		if !ok || !c.Proc.alive() {
			continue // not isolated yet, or gone since the listing
		}
		uses[c.ID] = minors
		alive = append(alive, c)
		s.seen[c.ID] = true
		s.procs[c.Proc] = c.ID
		for ctl, p := range cgroupsOf(c.Proc.Pid) {
			if p != "/" && p != "" && p != s.own[ctl] {
				s.cgroups[filepath.Join(cgroupRoot, ctl, p)] = c.ID
			}
		}
		for _, m := range minors {
			for other, id := range holder {
				if id != c.ID && (other == m || other == allGPUs || m == allGPUs) {
					s.failures = append(s.failures, fmt.Sprintf("GPU minor %s allowed to live containers %s and %s at once (%s)", minorName(m), id, c.ID, path))
				}
			}
			holder[m] = c.ID
		}
	}
	if s.held == nil || len(alive) == 0 {
		return
	}
	// The allocator holds, for each container that still runs after its
	// state was read, every GPU its device cgroup allows.
	held, err := s.held()
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
		if len(free) > 0 && c.Proc.alive() {
			s.failures = append(s.failures, fmt.Sprintf("live container %s is allowed GPU minors %v, which the allocator does not hold for it (it holds %v)", c.ID, free, held[c.ID]))
		}
	}
}

func minorName(m int) string {
	if m == allGPUs {
		return "*"
	}
	return strconv.Itoa(m)
}

// seenRunning returns how many containers the sampler saw running.
func (s *sampler) seenRunning() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

// leftovers lists what is left of the containers the sampler saw, other
// than those of keep (still running by design): processes and cgroups.
func (s *sampler) leftovers(keep map[string]bool) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var left []string
	for p, id := range s.procs {
		if !keep[id] && p.alive() {
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

// allocations reads the allocator's state file in dir: the UUIDs of the
// GPUs it holds for each owner.
func allocations(dir string) (map[string][]string, error) {
	b, err := os.ReadFile(filepath.Join(dir, allocator.StateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st struct {
		State struct {
			Owners []struct {
				Owner   string `json:"owner"`
				Devices []struct {
					UUID string `json:"uuid"`
				} `json:"devices"`
			} `json:"owners"`
		} `json:"state"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", allocator.StateFile, err)
	}
	out := map[string][]string{}
	for _, o := range st.State.Owners {
		out[o.Owner] = []string{}
		for _, d := range o.Devices {
			out[o.Owner] = append(out[o.Owner], d.UUID)
		}
	}
	return out, nil
}

// owners reads the owners of the allocator's state file in dir.
func owners(dir string) ([]string, error) {
	held, err := allocations(dir)
	var out []string
	for o := range held {
		out = append(out, o)
	}
	slices.Sort(out)
	return out, err
}

// mountsUnder lists the mounts of this mount namespace whose mount point or
// source lies under one of dirs.
func mountsUnder(dirs ...string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return []string{"/proc/self/mountinfo: " + err.Error()}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		for _, d := range dirs {
			if strings.Contains(sc.Text(), d+"/") {
				out = append(out, "mount "+sc.Text())
				break
			}
		}
	}
	return out
}

// mountPoints lists the mount points of this mount namespace under dir.
func mountPoints(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for l := range strings.Lines(string(b)) {
		if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// entries lists the names in dir, but those of skip.
func entries(dir string, skip ...string) []string {
	list, _ := os.ReadDir(dir)
	var out []string
	for _, e := range list {
		if !slices.Contains(skip, e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}
