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

// Owner is an owner id that obeys the owner-id rule (ValidateOwner):
// ParseOwner makes one, so that a program checks an id once, where it
// enters (a flag, a request, a claim), and hands on a value that carries
// the check. Its zero value is the empty id, which is not valid.
//
// The library's functions take owner ids as strings and check them
// themselves, as each is a door for its callers: pass o.String().
type Owner string

// ParseOwner returns s as an Owner, or an *InvalidOwnerError (matching
// ErrInvalidOwner and ErrInvalid) when s breaks the owner-id rule.
func ParseOwner(s string) (Owner, error) {
	if err := ValidateOwner(s); err != nil {
		return "", err
	}
	return Owner(s), nil
}

// String is the owner id.
func (o Owner) String() string { return string(o) }

// Valid reports whether o obeys the owner-id rule: true for every Owner
// ParseOwner made, false for the zero Owner and for a conversion of a
// string that breaks the rule.
func (o Owner) Valid() bool { return ValidateOwner(string(o)) == nil }

// MarshalText is the owner id. An Owner that is not Valid is an error.
func (o Owner) MarshalText() ([]byte, error) {
	if err := ValidateOwner(string(o)); err != nil {
		return nil, err
	}
	return []byte(o), nil
}

// UnmarshalText reads an owner id as ParseOwner does, so that a flag
// (flag.TextVar) or a decoded field of type Owner is checked as it is
// read. On error o is left as it was.
func (o *Owner) UnmarshalText(b []byte) error {
	p, err := ParseOwner(string(b))
	if err != nil {
		return err
	}
	*o = p
	return nil
}

func alnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
