package allocator

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// Operator compares a device attribute with a constraint's value, with
// Nomad's semantics.
type Operator string

// Operators.
const (
	OpEqual        Operator = "="
	OpNotEqual     Operator = "!="
	OpLess         Operator = "<"
	OpLessEqual    Operator = "<="
	OpGreater      Operator = ">"
	OpGreaterEqual Operator = ">="
	// OpRegexp matches the attribute's text against a regular expression.
	OpRegexp Operator = "regexp"
	// OpVersion holds when the attribute, read as a version, meets every
	// comma-separated condition of the value (">= 535, < 550").
	OpVersion Operator = "version"
	// OpSetContains holds when the attribute, a comma-separated list,
	// holds every comma-separated item of the value.
	OpSetContains Operator = "set_contains"
	// OpIsSet holds when the device has the attribute; it takes no value.
	OpIsSet Operator = "is_set"
	// OpIsNotSet holds when the device lacks the attribute.
	OpIsNotSet Operator = "is_not_set"
)

var operators = []Operator{OpEqual, OpNotEqual, OpLess, OpLessEqual, OpGreater, OpGreaterEqual,
	OpRegexp, OpVersion, OpSetContains, OpIsSet, OpIsNotSet}

// Constraint restricts the devices a request may get: the named attribute
// compared with Value by Operator must hold. Attribute names are those of
// Device.Attributes (memory, power, driver_version, ...) and the device's
// own fields: model, brand, architecture, compute_capability, uuid, bus_id,
// numa_node, index, minor, mig. Nomad's spellings ${device.attr.memory} and
// ${device.model} are accepted. A numeric value may carry a unit ("4 GiB",
// "250 W"); it is compared with the attribute in base units.
type Constraint struct {
	Attribute string   `json:"attribute"`
	Operator  Operator `json:"operator"`
	Value     string   `json:"value,omitempty"`
}

// Affinity steers placement toward (positive Weight) or away from (negative
// Weight) devices on which its constraint holds. Weights lie in -100..100,
// as in Nomad.
type Affinity struct {
	Constraint
	Weight int `json:"weight"`
}

// MaxAffinityWeight bounds the magnitude of an affinity's weight.
const MaxAffinityWeight = 100

// ParseConstraint reads "<attribute> <operator> [value]", for example
// "memory >= 16 GiB", "model regexp V100", "mig is_not_set".
func ParseConstraint(s string) (Constraint, error) {
	fields := strings.Fields(s)
	if len(fields) < 2 {
		return Constraint{}, fmt.Errorf("constraint %q: want <attribute> <operator> [value]: %w", s, ErrInvalidConstraint)
	}
	c := Constraint{Attribute: fields[0], Operator: Operator(fields[1]), Value: strings.Join(fields[2:], " ")}
	if err := c.Validate(); err != nil {
		return Constraint{}, err
	}
	return c, nil
}

// String writes the constraint as ParseConstraint reads it.
func (c Constraint) String() string {
	return strings.TrimSpace(c.Attribute + " " + string(c.Operator) + " " + c.Value)
}

// Validate checks the operator, the attribute name and that the value suits
// the operator.
func (c Constraint) Validate() error {
	_, err := c.compile()
	return err
}

// compile is Validate, and c made ready to test devices when it is valid.
func (c Constraint) compile() (matcher, error) {
	bad := func(why string) (matcher, error) {
		return matcher{}, fmt.Errorf("constraint %q: %s: %w", c.String(), why, ErrInvalidConstraint)
	}
	m := c.matcher()
	if m.name == "" || strings.ContainsAny(m.name, " \t\r\n") {
		return bad("no attribute")
	}
	known := false
	for _, op := range operators {
		known = known || op == c.Operator
	}
	if !known {
		return bad("unknown operator")
	}
	switch c.Operator {
	case OpIsSet, OpIsNotSet:
		if c.Value != "" {
			return bad("operator takes no value")
		}
	case OpRegexp, OpVersion:
		if m.err != nil {
			return bad(m.err.Error())
		}
	default:
		if c.Value == "" {
			return bad("operator needs a value")
		}
	}
	return m, nil
}

// Validate checks the constraint and the weight.
func (a Affinity) Validate() error {
	if err := a.validWeight(); err != nil {
		return err
	}
	return a.Constraint.Validate()
}

// validWeight checks the weight alone.
func (a Affinity) validWeight() error {
	if a.Weight == 0 || a.Weight < -MaxAffinityWeight || a.Weight > MaxAffinityWeight {
		return fmt.Errorf("affinity %q: weight %d not in -100..100 or zero: %w", a.String(), a.Weight, ErrInvalidConstraint)
	}
	return nil
}

// attributeName strips Nomad's ${device.attr.X} / ${device.X} spelling.
func attributeName(s string) string {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "${") && strings.HasSuffix(s, "}") {
		s = s[2 : len(s)-1]
	}
	s = strings.TrimPrefix(s, "device.")
	s = strings.TrimPrefix(s, "attr.")
	return s
}

// lookup returns the attribute of d named name.
func lookup(d *node.Device, name string) (node.Attribute, bool) {
	str := func(v string) (node.Attribute, bool) { return node.StringAttribute(v), v != "" }
	num := func(v int64, ok bool) (node.Attribute, bool) { return node.IntAttribute(v, ""), ok }
	switch name {
	case "model":
		return str(d.Model)
	case "brand":
		return str(d.Brand)
	case "architecture":
		return str(d.Architecture)
	case "compute_capability":
		return str(d.ComputeCapability)
	case "uuid":
		return str(d.UUID)
	case "bus_id":
		return str(d.BusID)
	case "mig":
		return str(string(d.MIG))
	case "numa_node":
		return num(int64(d.NUMANode), d.NUMANode != node.NoNUMANode)
	case "index":
		return num(int64(d.Index), true)
	case "minor":
		return num(int64(d.Minor), d.Minor != node.NoMinor)
	case "vendor":
		return str("nvidia")
	case "type":
		return str("gpu")
	}
	a, ok := d.Attributes[name]
	return a, ok
}

// Matches tells whether the constraint holds on d. A constraint that cannot
// be evaluated (a unit of another dimension, a bad version) does not hold.
func (c Constraint) Matches(d *node.Device) bool { return c.matcher().matches(d) }

// matcher is a constraint made ready to test device after device: its
// attribute's name, and its regular expression or version conditions,
// compiled once (err: they do not compile).
type matcher struct {
	Constraint
	name  string
	re    *regexp.Regexp
	conds []versionCondition
	err   error
}

// matcher compiles c for matches.
func (c Constraint) matcher() matcher {
	m := matcher{Constraint: c, name: attributeName(c.Attribute)}
	switch c.Operator {
	case OpRegexp:
		m.re, m.err = regexp.Compile(c.Value)
	case OpVersion:
		m.conds, m.err = parseVersionConditions(c.Value)
	}
	return m
}

// matches is Constraint.Matches, of the compiled constraint.
func (m matcher) matches(d *node.Device) bool {
	a, ok := lookup(d, m.name)
	switch m.Operator {
	case OpIsSet:
		return ok
	case OpIsNotSet:
		return !ok
	}
	if !ok {
		return false
	}
	switch m.Operator {
	case OpRegexp:
		return m.err == nil && m.re.MatchString(a.Format())
	case OpVersion:
		if m.err != nil {
			return false
		}
		v, err := node.ParseVersion(a.Format())
		if err != nil {
			return false
		}
		for _, cond := range m.conds {
			if !cond.op.Holds(v.Compare(cond.v)) {
				return false
			}
		}
		return true
	case OpSetContains:
		have := map[string]bool{}
		for _, item := range strings.Split(a.Format(), ",") {
			have[strings.TrimSpace(item)] = true
		}
		for _, item := range strings.Split(m.Value, ",") {
			if !have[strings.TrimSpace(item)] {
				return false
			}
		}
		return true
	}
	cmp, ok := compareAttribute(a, m.Value)
	return ok && m.Operator.Holds(cmp)
}

// Holds reports whether a comparison result (negative, zero or positive, as
// from cmp.Compare) satisfies the operator. Operators that do not compare
// (regexp, set_contains, is_set, ...) never hold here.
func (op Operator) Holds(cmp int) bool { return node.Op(op).Holds(cmp) }

// compareAttribute compares a with the constraint value v: numbers in base
// units, booleans as such, text as text (numbers in text compare as numbers).
func compareAttribute(a node.Attribute, v string) (int, bool) {
	switch a.Kind {
	case node.KindInt:
		have, ok := toBase(float64(a.Int), a.Unit)
		if !ok {
			return 0, false
		}
		want, ok := parseQuantity(v, a.Unit)
		if !ok {
			return 0, false
		}
		return cmpFloat(have, want), true
	case node.KindBool:
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return 0, false
		}
		if a.Bool == b {
			return 0, true
		}
		return 1, true
	case node.KindString:
		s := a.String
		if x, err := strconv.ParseFloat(s, 64); err == nil {
			if y, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				return cmpFloat(x, y), true
			}
		}
		return strings.Compare(s, v), true
	}
	return 0, false
}

func cmpFloat(x, y float64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// unit is a unit's dimension and factor to the dimension's base unit.
type unit struct {
	dim    string
	factor float64
}

var units = map[string]unit{
	"B": {"bytes", 1}, "KB": {"bytes", 1e3}, "kB": {"bytes", 1e3}, "MB": {"bytes", 1e6}, "GB": {"bytes", 1e9}, "TB": {"bytes", 1e12},
	"KiB": {"bytes", 1 << 10}, "MiB": {"bytes", 1 << 20}, "GiB": {"bytes", 1 << 30}, "TiB": {"bytes", 1 << 40},
	"B/s": {"bytes/s", 1}, "KB/s": {"bytes/s", 1e3}, "kB/s": {"bytes/s", 1e3}, "MB/s": {"bytes/s", 1e6}, "GB/s": {"bytes/s", 1e9},
	"KiB/s": {"bytes/s", 1 << 10}, "MiB/s": {"bytes/s", 1 << 20}, "GiB/s": {"bytes/s", 1 << 30},
	"mW": {"watts", 1e-3}, "W": {"watts", 1}, "kW": {"watts", 1e3},
	"Hz": {"hertz", 1}, "kHz": {"hertz", 1e3}, "KHz": {"hertz", 1e3}, "MHz": {"hertz", 1e6}, "GHz": {"hertz", 1e9},
}

func toBase(v float64, unitName string) (float64, bool) {
	if unitName == "" {
		return v, true
	}
	u, ok := units[unitName]
	if !ok {
		return 0, false
	}
	return v * u.factor, true
}

// parseQuantity reads "16", "16GiB" or "16 GiB" in base units of attrUnit's
// dimension; a bare number is in attrUnit.
func parseQuantity(s, attrUnit string) (float64, bool) {
	s = strings.TrimSpace(s)
	end := 0
	for end < len(s) && (s[end] == '-' || s[end] == '+' || s[end] == '.' || s[end] == 'e' && end > 0 || s[end] >= '0' && s[end] <= '9') {
		end++
	}
	num, err := strconv.ParseFloat(s[:end], 64)
	if err != nil || math.IsNaN(num) || math.IsInf(num, 0) {
		return 0, false
	}
	name := strings.TrimSpace(s[end:])
	if name == "" {
		return toBase(num, attrUnit)
	}
	u, ok := units[name]
	if !ok {
		return 0, false
	}
	if attrUnit != "" {
		if au, ok := units[attrUnit]; !ok || au.dim != u.dim {
			return 0, false
		}
	}
	return num * u.factor, true
}

type versionCondition struct {
	op Operator
	v  node.Version
}

// parseVersionConditions reads ">= 1.2, < 2" (no operator means "=").
func parseVersionConditions(s string) ([]versionCondition, error) {
	var out []versionCondition
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		op := OpEqual
		for _, cand := range []Operator{OpGreaterEqual, OpLessEqual, OpNotEqual, OpGreater, OpLess, OpEqual} {
			if strings.HasPrefix(part, string(cand)) {
				op, part = cand, strings.TrimSpace(part[len(cand):])
				break
			}
		}
		v, err := node.ParseVersion(part)
		if err != nil {
			return nil, err
		}
		out = append(out, versionCondition{op, v})
	}
	return out, nil
}

// modelName reads a request's model: "nvidia/gpu/<model>", "nvidia/gpu",
// "gpu" (any model) or a bare model name. It returns "" for any model.
func modelName(s string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "gpu" || s == "nvidia/gpu" {
		return "", nil
	}
	if rest, ok := strings.CutPrefix(s, "nvidia/gpu/"); ok {
		if strings.TrimSpace(rest) == "" {
			return "", fmt.Errorf("model %q: empty model name: %w", s, ErrInvalidRequest)
		}
		return strings.TrimSpace(rest), nil
	}
	if strings.Count(s, "/") > 0 {
		return "", fmt.Errorf("model %q: want nvidia/gpu/<model>: %w", s, ErrInvalidRequest)
	}
	return s, nil
}

// builtinAttributes are the attributes every device answers (see lookup).
var builtinAttributes = []string{"model", "brand", "architecture", "compute_capability", "uuid", "bus_id", "mig", "numa_node", "index", "minor", "vendor", "type"}

// hasModel tells whether some GPU of the node is of model.
func (a *Allocator) hasModel(model string) bool {
	for _, d := range a.inv.Devices {
		if strings.EqualFold(d.Model, model) {
			return true
		}
	}
	return false
}

// knownAttribute refuses a constraint on an attribute no GPU of the node
// has (a misspelling would otherwise read as "not enough free GPUs"); only
// is_set and is_not_set may ask about any attribute.
func (a *Allocator) knownAttribute(c Constraint) error {
	if c.Operator == OpIsSet || c.Operator == OpIsNotSet {
		return nil
	}
	name := attributeName(c.Attribute)
	if slices.Contains(builtinAttributes, name) {
		return nil
	}
	for _, d := range a.inv.Devices {
		if _, ok := d.Attributes[name]; ok {
			return nil
		}
	}
	return fmt.Errorf("constraint %q: no GPU of this node has attribute %q: %w", c.String(), name, ErrInvalidRequest)
}
