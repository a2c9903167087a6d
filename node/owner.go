package node

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxOwnerLen is the longest owner id accepted, in bytes.
const MaxOwnerLen = 128

// ErrInvalidOwner: an owner id breaks the owner-id rule. See
// InvalidOwnerError.
var ErrInvalidOwner = Sentinel(ErrInvalid, "invalid owner id")

// InvalidOwnerError is an owner id that cannot be accepted, and why.
type InvalidOwnerError struct {
	Owner  string
	Reason string
}

func (e *InvalidOwnerError) Error() string {
	return fmt.Sprintf("owner %q: %s: %s", e.Owner, e.Reason, ErrInvalidOwner)
}

// Is makes errors.Is(err, ErrInvalidOwner) and errors.Is(err, ErrInvalid) hold.
func (e *InvalidOwnerError) Is(target error) bool {
	return target == ErrInvalidOwner || target == ErrInvalid
}

// cgroupFilePrefixes are the prefixes of the files the kernel puts in every
// cgroup directory (v1 and v2): a child cgroup may not take such a name.
var cgroupFilePrefixes = [...]string{
	"cgroup.", "devices.", "memory.", "cpu.", "cpuacct.", "cpuset.", "io.", "blkio.",
	"pids.", "freezer.", "hugetlb.", "net_cls.", "net_prio.", "perf_event.", "rdma.", "misc.",
}

// reservedNames are the other names of cgroup v1's interface files.
var reservedNames = [...]string{"tasks", "notify_on_release", "release_agent"}

// ValidateOwner checks an owner id (a container's id) against the one rule
// every gpuiso package and every kernel or daemon name built from it obeys:
// 1 to MaxOwnerLen bytes of ASCII letters, digits, '_', '.' and '-',
// starting with a letter or digit (Docker's rule for container names, which
// is also a valid file, cgroup and label value), and not the name of a
// cgroup interface file (cgroup.procs, tasks, devices.allow, ...).
func ValidateOwner(owner string) error {
	bad := func(why string) error { return &InvalidOwnerError{Owner: owner, Reason: why} }
	switch {
	case owner == "":
		return bad("empty")
	case len(owner) > MaxOwnerLen:
		return bad("longer than " + strconv.Itoa(MaxOwnerLen) + " bytes")
	case !alnum(owner[0]):
		return bad("must start with a letter or digit")
	}
	for i := 0; i < len(owner); i++ {
		if c := owner[i]; !alnum(c) && c != '_' && c != '.' && c != '-' {
			return bad(fmt.Sprintf("holds %q: want letters, digits, '_', '.' and '-'", rune(c)))
		}
	}
	for _, p := range cgroupFilePrefixes {
		if strings.HasPrefix(owner, p) {
			return bad("is a cgroup interface file's name")
		}
	}
	for _, r := range reservedNames {
		if owner == r {
			return bad("is a cgroup interface file's name")
		}
	}
	return nil
}

func alnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
