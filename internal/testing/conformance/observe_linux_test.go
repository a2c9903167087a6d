package conformance

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// hierarchy is the directory of the cgroup hierarchy of controller ctl:
// its v1 hierarchy's, or on a cgroup2-only host the one hierarchy.
func hierarchy(ctl string) string {
	if testenv.CgroupV2Only() {
		return cgroupRoot
	}
	return filepath.Join(cgroupRoot, ctl)
}

// newSampler watches inst, whose node's GPUs have the minors minorOf (by
// UUID) on major.
func newSampler(inst instance, minorOf map[string]int, major uint32, every time.Duration) *Sampler {
	var minors []int
	for _, m := range minorOf {
		minors = append(minors, m)
	}
	return NewSampler(Watch{Live: inst.live, Held: HeldIn(inst.allocDir(), minorOf), GPUs: GPUsAllowed(major, minors), Every: every})
}

// owners reads the owners of the allocator's state file in dir.
func owners(dir string) ([]string, error) {
	held, err := Allocations(dir)
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
