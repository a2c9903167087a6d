package linux

import (
	"bufio"
	"bytes"
	"fmt"
	"path"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// ErrCgroupPath is returned for a cgroup path that is not absolute and
// clean, or for a /proc/<pid>/cgroup file that does not parse.
var ErrCgroupPath = node.Sentinel(node.ErrInvalid, "cgroup path")

// CgroupHierarchy is one mounted cgroup hierarchy: the directory of its
// root cgroup, and whether it is the unified (cgroup v2) hierarchy. A v1
// hierarchy names its controllers (cpuset, memory, or name=systemd).
type CgroupHierarchy struct {
	Dir         string
	V2          bool
	Controllers string
}

// ProcCgroups parses a /proc/<pid>/cgroup file: the cgroup of the process
// in each hierarchy, keyed by the hierarchy's controllers as the file
// lists them ("cpu,cpuacct", "name=systemd"; "" for the unified
// hierarchy), each an absolute path as the reader's cgroup namespace
// shows it.
func ProcCgroups(b []byte) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		id, rest, ok := strings.Cut(line, ":")
		if !ok || id == "" {
			return nil, fmt.Errorf("line %q: %w", line, ErrCgroupPath)
		}
		ctrl, p, ok := strings.Cut(rest, ":")
		if !ok || !strings.HasPrefix(p, "/") {
			return nil, fmt.Errorf("line %q: %w", line, ErrCgroupPath)
		}
		out[ctrl] = p
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no hierarchy listed: %w", ErrCgroupPath)
	}
	return out, nil
}

// CheckCgroupPath refuses a cgroup path that is not absolute and clean
// (no "..", no empty or "." component): a path that could leave the
// hierarchy it is joined to.
func CheckCgroupPath(p string) error {
	if !strings.HasPrefix(p, "/") || path.Clean(p) != p || strings.ContainsRune(p, 0) {
		return fmt.Errorf("%q is not an absolute, clean path: %w", p, ErrCgroupPath)
	}
	return nil
}
