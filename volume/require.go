package volume

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// Property is what a requirement condition is about.
type Property string

// The properties of NVIDIA_REQUIRE_* conditions.
const (
	PropCUDA   Property = "cuda"   // the driver's CUDA version, e.g. "12.2"
	PropDriver Property = "driver" // the driver version, e.g. "535.104.05"
	PropArch   Property = "arch"   // a GPU's compute capability, e.g. "8.0"
	PropBrand  Property = "brand"  // a GPU's brand, e.g. "tesla"
)

// Op is a comparison operator.
type Op string

// The operators, longest first as the parser tries them.
const (
	OpLessEqual    Op = "<="
	OpGreaterEqual Op = ">="
	OpNotEqual     Op = "!="
	OpEqual        Op = "="
	OpLess         Op = "<"
	OpGreater      Op = ">"
)

func ops() []Op {
	return []Op{OpLessEqual, OpGreaterEqual, OpNotEqual, OpEqual, OpLess, OpGreater}
}

// Condition is one "<property><op><value>".
type Condition struct {
	Property Property
	Op       Op
	Value    string
}

func (c Condition) String() string { return string(c.Property) + string(c.Op) + c.Value }

// Requirement is one parsed requirement: it holds when any of its
// alternatives holds, and an alternative holds when all its conditions do.
type Requirement struct {
	// Source names where it came from, e.g. "NVIDIA_REQUIRE_CUDA".
	Source string
	// Expr is the expression as written (or implied).
	Expr string
	// Alternatives are the space-separated parts; each holds the
	// comma-joined conditions.
	Alternatives [][]Condition
}

// maxValueLen bounds a condition's value.
const maxValueLen = 64

// ParseRequirement parses an NVIDIA_REQUIRE_* value such as
// "cuda>=11.0 brand=tesla,driver>=418,driver<419": spaces separate
// alternatives, commas join conditions. Versions (cuda, driver, arch) must be
// digits and dots; brands letters, digits, '-' and '_'; brands compare with
// = and != only, without regard to case. As NVIDIA's runtime does, empty
// conditions are skipped and conditions on unknown properties ("foo=45")
// are ignored: they hold.
func ParseRequirement(source, expr string) (Requirement, error) {
	r := Requirement{Source: source, Expr: expr}
	for alt := range strings.FieldsSeq(expr) {
		conds := []Condition{}
		for tok := range strings.SplitSeq(alt, ",") {
			if tok == "" {
				continue
			}
			c, err := parseCondition(expr, tok)
			if errors.Is(err, errUnknownProperty) {
				continue
			}
			if err != nil {
				return Requirement{}, err
			}
			conds = append(conds, c)
		}
		r.Alternatives = append(r.Alternatives, conds)
	}
	if len(r.Alternatives) == 0 {
		return Requirement{}, &SyntaxError{Expr: expr, Token: expr, Reason: "empty"}
	}
	return r, nil
}

func parseCondition(expr, tok string) (Condition, error) {
	bad := func(reason string) (Condition, error) {
		return Condition{}, &SyntaxError{Expr: expr, Token: tok, Reason: reason}
	}
	i := strings.IndexAny(tok, "<>=!")
	if i < 0 {
		return bad("no operator (= != < <= > >=)")
	}
	c := Condition{Property: Property(strings.ToLower(tok[:i]))}
	rest := tok[i:]
	for _, op := range ops() {
		if v, ok := strings.CutPrefix(rest, string(op)); ok {
			c.Op, c.Value = op, v
			break
		}
	}
	switch {
	case c.Op == "":
		return bad("no operator (= != < <= > >=)")
	case c.Value == "" || len(c.Value) > maxValueLen:
		return bad("value missing or too long")
	}
	switch c.Property {
	case PropCUDA, PropDriver, PropArch:
		if ValidateVersion(c.Value) != nil || !versionFits(c.Value) {
			return bad("value is not a version (digits and dots)")
		}
	case PropBrand:
		if c.Op != OpEqual && c.Op != OpNotEqual {
			return bad("brands compare with = and != only")
		}
		for _, r := range c.Value {
			if !(r == '-' || r == '_' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')) {
				return bad("brand is not a word")
			}
		}
	default:
		return Condition{}, errUnknownProperty
	}
	return c, nil
}

// errUnknownProperty marks a condition on a property the runtime ignores.
var errUnknownProperty = errors.New("unknown property")

// versionFits reports whether every component of v is a number that a
// uint64 holds.
func versionFits(v string) bool {
	for p := range strings.SplitSeq(v, ".") {
		if _, err := strconv.ParseUint(p, 10, 64); err != nil {
			return false
		}
	}
	return true
}

// Driver is what the host's driver offers, for requirement checks.
type Driver struct {
	// Version is the driver version, e.g. "535.104.05".
	Version string
	// CUDA is the newest CUDA version it supports; 0 when unknown.
	CUDA node.CUDAVersion
}

// facts are the values conditions are checked against; "" is unknown.
type facts struct {
	cuda, driver, arch, brand string
	gpu                       bool
}

// holds evaluates r. Conditions on a GPU property hold trivially when no
// GPU is given (there is nothing to contradict them); conditions on an
// unknown driver property fail.
func (r Requirement) holds(f facts) bool { return r.failed(f) == nil }

// failed returns, when r does not hold, the first failing condition of each
// alternative; nil when r holds.
func (r Requirement) failed(f facts) []Condition {
	var failed []Condition
	for _, conds := range r.Alternatives {
		i := slices.IndexFunc(conds, func(c Condition) bool { return !c.holds(f) })
		if i < 0 {
			return nil
		}
		failed = append(failed, conds[i])
	}
	return failed
}

func (c Condition) holds(f facts) bool {
	var have string
	switch c.Property {
	case PropCUDA:
		have = f.cuda
	case PropDriver:
		have = f.driver
	case PropArch:
		if !f.gpu {
			return true
		}
		have = f.arch
	case PropBrand:
		if !f.gpu {
			return true
		}
		eq := strings.EqualFold(f.brand, c.Value)
		return eq == (c.Op == OpEqual)
	}
	if have == "" {
		return false
	}
	// The requirement operators are the allocator's comparison operators.
	return allocator.Operator(c.Op).Holds(compareVersions(have, c.Value))
}

// Requirements returns the image's requirements: every NVIDIA_REQUIRE_*
// variable but NVIDIA_REQUIRE_JETPACK*; "cuda>=<major.minor>" implied by
// CUDA_VERSION when NVIDIA_REQUIRE_CUDA is not set or empty; "cuda>=<label>"
// for the com.nvidia.cuda.version label of nvidia-docker 1.0 images (an
// empty label means no check). None when
// NVIDIA_DISABLE_REQUIRE is true. A requirement that does not parse is an
// error; the image is then refused, not run unchecked.
func (img Image) Requirements() ([]Requirement, error) {
	if v, ok := img.Getenv(EnvDisableRequire); ok {
		if off, err := strconv.ParseBool(v); err == nil && off {
			return nil, nil
		}
	}
	env := map[string]string{}
	var names []string
	for _, kv := range img.Env {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, EnvRequirePrefix) && k != EnvRequirePrefix && !strings.HasPrefix(k, envRequireJetpack) {
			if _, dup := env[k]; !dup {
				names = append(names, k)
			}
			env[k] = v
		}
	}
	slices.Sort(names)
	var reqs []Requirement
	for _, k := range names {
		if strings.TrimSpace(env[k]) == "" {
			continue
		}
		r, err := ParseRequirement(k, env[k])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		reqs = append(reqs, r)
	}
	if strings.TrimSpace(env[EnvRequireCUDA]) == "" {
		if v, ok := img.Getenv(EnvCUDAVersion); ok && strings.TrimSpace(v) != "" {
			r, err := impliedCUDA(EnvCUDAVersion, v)
			if err != nil {
				return nil, err
			}
			reqs = append(reqs, r)
		}
	}
	if v, ok := img.Labels[LabelCUDAVersion]; ok && strings.TrimSpace(v) != "" {
		r, err := impliedCUDA(LabelCUDAVersion, v)
		if err != nil {
			return nil, err
		}
		reqs = append(reqs, r)
	}
	return reqs, nil
}

// impliedCUDA turns "11.0.3" into "cuda>=11.0".
func impliedCUDA(source, v string) (Requirement, error) {
	parts := strings.SplitN(strings.TrimSpace(v), ".", 3)
	mm := parts[0]
	if len(parts) > 1 {
		mm += "." + parts[1]
	}
	r, err := ParseRequirement(source, string(PropCUDA)+string(OpGreaterEqual)+mm)
	if err != nil {
		return Requirement{}, fmt.Errorf("%s=%q: %w", source, v, err)
	}
	return r, nil
}

// Check checks the image's requirements against the driver and the GPUs
// allocated to the container: every requirement must hold for the driver and
// for each GPU. The first one that does not gives an *UnmetError naming it
// and the values it was checked against.
func Check(img Image, drv Driver, gpus []node.Device) error {
	reqs, err := img.Requirements()
	if err != nil {
		return err
	}
	f := facts{driver: drv.Version}
	if drv.CUDA > 0 {
		f.cuda = drv.CUDA.String()
	}
	unmet := func(r Requirement, failed []Condition) *UnmetError {
		return &UnmetError{Source: r.Source, Expr: r.Expr, Failed: failed, Driver: drv.Version, CUDA: f.cuda, GPU: -1}
	}
	for _, r := range reqs {
		if failed := r.failed(f); failed != nil { // the driver alone fails it, whatever the GPUs
			return unmet(r, failed)
		}
		for _, g := range gpus {
			gf := f
			gf.gpu, gf.arch, gf.brand = true, g.ComputeCapability, requirementBrand(g.Brand)
			if failed := r.failed(gf); failed != nil {
				e := unmet(r, failed)
				e.GPU, e.Arch, e.Brand = g.Index, g.ComputeCapability, gf.brand
				return e
			}
		}
	}
	return nil
}
