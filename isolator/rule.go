package isolator

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/node"
)

// Wildcard stands for any major or minor number in a Rule.
const Wildcard int64 = -1

// Rule is one device-cgroup rule: allow (or deny) a type of device, by
// major:minor, for some of read (r), write (w) and mknod (m).
type Rule struct {
	Allow bool
	// Type is 'c' (character), 'b' (block) or 'a' (all).
	Type byte
	// Major and Minor are device numbers, or Wildcard.
	Major, Minor int64
	// Access is a non-empty subset of "rwm", in that order.
	Access string
}

// Allow returns a rule allowing the character device major:minor.
func Allow(major, minor int64, access string) Rule {
	return Rule{Allow: true, Type: 'c', Major: major, Minor: minor, Access: access}
}

// String writes the rule as devices.list and devices.allow do:
// "c 195:1 rwm", "a *:* rwm".
func (r Rule) String() string {
	num := func(n int64) string {
		if n == Wildcard {
			return "*"
		}
		return strconv.FormatInt(n, 10)
	}
	return fmt.Sprintf("%c %s:%s %s", r.Type, num(r.Major), num(r.Minor), r.Access)
}

// Validate checks the rule's fields.
func (r Rule) Validate() error {
	if r.Type != 'a' && r.Type != 'b' && r.Type != 'c' {
		return fmt.Errorf("%w: type %q, want a, b or c", ErrInvalidRule, r.Type)
	}
	if r.Major < Wildcard || r.Minor < Wildcard || r.Major > 1<<32-1 || r.Minor > 1<<32-1 {
		return fmt.Errorf("%w: device number %d:%d", ErrInvalidRule, r.Major, r.Minor)
	}
	if r.Access == "" || normalAccess(r.Access) != r.Access {
		return fmt.Errorf("%w: access %q, want a subset of \"rwm\" in that order", ErrInvalidRule, r.Access)
	}
	return nil
}

// normalAccess is the subset of "rwm" that s names, in that order: equal to s
// exactly when s is a well-formed access string.
func normalAccess(s string) string {
	var out []byte
	for _, c := range []byte("rwm") {
		if strings.IndexByte(s, c) >= 0 {
			out = append(out, c)
		}
	}
	return string(out)
}

// ParseRule reads an allow rule in devices.list form ("c 195:1 rwm").
func ParseRule(s string) (Rule, error) {
	f := strings.Fields(s)
	if len(f) != 3 || len(f[0]) != 1 {
		return Rule{}, fmt.Errorf("%w: %q: want \"<type> <major>:<minor> <access>\"", ErrInvalidRule, s)
	}
	maj, min, ok := strings.Cut(f[1], ":")
	if !ok {
		return Rule{}, fmt.Errorf("%w: %q: want major:minor", ErrInvalidRule, s)
	}
	num := func(v string) (int64, error) {
		if v == "*" {
			return Wildcard, nil
		}
		return strconv.ParseInt(v, 10, 64)
	}
	major, err1 := num(maj)
	minor, err2 := num(min)
	if err1 != nil || err2 != nil {
		return Rule{}, fmt.Errorf("%w: %q: bad device number", ErrInvalidRule, s)
	}
	r := Rule{Allow: true, Type: f[0][0], Major: major, Minor: minor, Access: f[2]}
	if err := r.Validate(); err != nil {
		return Rule{}, fmt.Errorf("%q: %w", s, err)
	}
	return r, nil
}

// ParseDevicesList reads a cgroup v1 devices.list: the allow rules in force.
func ParseDevicesList(rd io.Reader) ([]Rule, error) {
	var rules []Rule
	sc := bufio.NewScanner(rd)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		r, err := ParseRule(line)
		if err != nil {
			return nil, err
		}
		rules = append(rules, r)
	}
	return rules, sc.Err()
}

// LinuxDeviceCgroup converts the rule to the runtime-spec form, with
// wildcards as -1 (never nil, which containerd's eBPF filter cannot take).
func (r Rule) LinuxDeviceCgroup() specs.LinuxDeviceCgroup {
	major, minor := r.Major, r.Minor
	return specs.LinuxDeviceCgroup{Allow: r.Allow, Type: string(r.Type), Major: &major, Minor: &minor, Access: r.Access}
}

// DefaultRules is the allow list container runtimes give every container:
// mknod of any device, and the usual pseudo devices (null, zero, full,
// random, urandom, tty, console, ptmx, pts, tun).
func DefaultRules() []Rule {
	return []Rule{
		{Allow: true, Type: 'c', Major: Wildcard, Minor: Wildcard, Access: "m"},
		{Allow: true, Type: 'b', Major: Wildcard, Minor: Wildcard, Access: "m"},
		Allow(1, 3, "rwm"), Allow(1, 5, "rwm"), Allow(1, 7, "rwm"), Allow(1, 8, "rwm"), Allow(1, 9, "rwm"),
		Allow(5, 0, "rwm"), Allow(5, 1, "rwm"), Allow(5, 2, "rwm"),
		Allow(136, Wildcard, "rwm"), Allow(10, 200, "rwm"),
	}
}

// GPURules is the allow list of a GPU container: the defaults, the control
// devices every GPU container needs (nvidiactl, nvidia-uvm,
// nvidia-uvm-tools), then one rule per node of each owned device (see
// GPUNodes), with the numbers discovery read (c <major>:<minor> rwm). A MIG
// device adds its parent's node and the capability nodes of its GPU
// instance and compute instance, nothing of its sibling instances. It is
// DeviceRules of the nodes NewPlan gives the same devices.
func GPURules(control []node.ControlDevice, gpus []node.DeviceRef) []Rule {
	var devs []DeviceNode
	for _, c := range control {
		if c.Name == node.NVIDIAModeset {
			continue // display capability only
		}
		devs = append(devs, DeviceNode{Path: c.Path, Major: c.Major, Minor: c.Minor})
	}
	for _, g := range gpus {
		devs = append(devs, GPUNodes(g)...)
	}
	return DeviceRules(devs)
}

// Canonical returns the allow rules sorted and without duplicates, the form
// in which rule lists are compared.
func Canonical(rules []Rule) []Rule {
	out := slices.Clone(rules)
	slices.SortFunc(out, func(a, b Rule) int {
		if c := compare(a.Type, b.Type); c != 0 {
			return c
		}
		if c := compare(a.Major, b.Major); c != 0 {
			return c
		}
		if c := compare(a.Minor, b.Minor); c != 0 {
			return c
		}
		return strings.Compare(a.Access, b.Access)
	})
	return slices.Compact(out)
}

func compare[T int64 | byte](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
