package node

import (
	"fmt"
	"strconv"
	"strings"
)

// Op is a comparison operator between a value and a bound: the operators of
// NVIDIA_REQUIRE_* conditions and of the allocator's constraints.
type Op string

// The comparison operators.
const (
	OpEqual        Op = "="
	OpNotEqual     Op = "!="
	OpLess         Op = "<"
	OpLessEqual    Op = "<="
	OpGreater      Op = ">"
	OpGreaterEqual Op = ">="
)

// Ops are the comparison operators, two-character ones first, in the order
// a parser must try them as prefixes.
func Ops() []Op {
	return []Op{OpNotEqual, OpLessEqual, OpGreaterEqual, OpEqual, OpLess, OpGreater}
}

// Holds reports whether a comparison result (negative, zero or positive, as
// from cmp.Compare) satisfies op. Any other Op never holds.
func (op Op) Holds(cmp int) bool {
	switch op {
	case OpEqual:
		return cmp == 0
	case OpNotEqual:
		return cmp != 0
	case OpLess:
		return cmp < 0
	case OpLessEqual:
		return cmp <= 0
	case OpGreater:
		return cmp > 0
	case OpGreaterEqual:
		return cmp >= 0
	}
	return false
}

// Version is a dotted version's numeric components: "535.104.05" is
// [535 104 5].
type Version []uint64

// ParseVersion reads a dotted version of numbers ("535.104.05", "12.2"; a
// leading "v" and surrounding space allowed).
func ParseVersion(s string) (Version, error) {
	t := strings.TrimPrefix(strings.TrimSpace(s), "v")
	if t == "" {
		return nil, fmt.Errorf("version %q: empty: %w", s, ErrInvalid)
	}
	var v Version
	for part := range strings.SplitSeq(t, ".") {
		n, err := strconv.ParseUint(part, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("version %q: component %q is not a number: %w", s, part, ErrInvalid)
		}
		v = append(v, n)
	}
	return v, nil
}

// Compare compares v and w component by component, a missing component
// counting as 0: -1, 0 or 1.
func (v Version) Compare(w Version) int {
	for i := range max(len(v), len(w)) {
		var x, y uint64
		if i < len(v) {
			x = v[i]
		}
		if i < len(w) {
			y = w[i]
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}

// CompareVersions compares dotted versions component by component as
// numbers, a missing component counting as 0: "418" < "418.87.01" < "419",
// "535.309.01" == "535.309.1". Components that are not numbers compare as
// text.
func CompareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(as), len(bs)) {
		x, y := "0", "0"
		if i < len(as) {
			x = as[i]
		}
		if i < len(bs) {
			y = bs[i]
		}
		xi, errx := strconv.ParseUint(x, 10, 64)
		yi, erry := strconv.ParseUint(y, 10, 64)
		switch {
		case errx != nil || erry != nil:
			if c := strings.Compare(x, y); c != 0 {
				return c
			}
		case xi < yi:
			return -1
		case xi > yi:
			return 1
		}
	}
	return 0
}
