package node

import (
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
