package volume

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/mod/semver"

	"github.com/gpuiso/gpuiso/node"
)

// Property is what a requirement condition is about.
type Property string

// The properties of NVIDIA_REQUIRE_* conditions. Names are case-sensitive,
// as NVIDIA's runtime reads them: "CUDA>=12" is a condition on an unknown
// property.
const (
	PropCUDA   Property = "cuda"   // the driver's CUDA version, e.g. "12.2"
	PropDriver Property = "driver" // the driver version, e.g. "535.104.05"
	PropArch   Property = "arch"   // a GPU's compute capability, e.g. "8.0"
	PropBrand  Property = "brand"  // a GPU's brand, e.g. "tesla"
)

// Condition is one "<property><op><value>". Op is empty for a brand
// condition written without a known operator ("brand!tesla"): such a
// condition never holds.
type Condition struct {
	Property Property
	Op       node.Op
	Value    string
}

func (c Condition) String() string { return string(c.Property) + string(c.Op) + c.Value }

// Requirement is one parsed requirement: it holds when any of its
// alternatives holds, and an alternative holds when all its conditions do.
// A requirement without alternatives (none had a known condition) always
// holds.
type Requirement struct {
	// Source names where it came from, e.g. "NVIDIA_REQUIRE_CUDA".
	Source string
	// Expr is the expression as written (or implied).
	Expr string
	// Alternatives are the space-separated parts that hold a known
	// condition; each holds its comma-joined conditions.
	Alternatives [][]Condition
}

// ParseRequirement parses an NVIDIA_REQUIRE_* value such as
// "cuda>=11.0 brand=tesla,driver>=418,driver<419" as the NVIDIA Container
// Toolkit's requirement parser reads it:
//
//   - a single space separates alternatives and a comma joins conditions;
//     any other white space (a tab, a newline) is part of a condition;
//   - an empty or blank condition is skipped;
//   - a condition without any of the characters < > = ! is an error;
//   - the property is the text before the first of them; a condition on
//     any property but cuda, driver, arch and brand is skipped;
//   - the operator is the first of != <= >= = < > that follows; the rest
//     is the value;
//   - a cuda, driver or arch value is a semantic version, a leading "v"
//     allowed: one to three numbers without leading zeros ("12", "12.2",
//     "v12.2.1"), a pre-release and build suffix only after three
//     ("12.2.0-rc1"); "12.2.0.1", "12.2x", "12..2" and "535.104.05" are
//     errors. Numbers have no size limit;
//   - a brand value is any text; a brand written without an operator
//     ("brand!tesla") gives a condition that never holds;
//   - an alternative left with no condition is dropped, so "cuda>=13.0
//     foo=bar" and "cuda>=13.0 ," both mean "cuda>=13.0", and an expression
//     with no known condition at all ("foo=bar", "") always holds.
//
// Errors are *SyntaxError, matching ErrInvalidRequirement.
func ParseRequirement(source, expr string) (Requirement, error) {
	r := Requirement{Source: source, Expr: expr}
	for alt := range strings.SplitSeq(expr, " ") {
		var conds []Condition
		for tok := range strings.SplitSeq(alt, ",") {
			c, ok, err := parseCondition(expr, tok)
			if err != nil {
				return Requirement{}, err
			}
			if ok {
				conds = append(conds, c)
			}
		}
		if len(conds) > 0 {
			r.Alternatives = append(r.Alternatives, conds)
		}
	}
	return r, nil
}

// parseCondition parses one condition; ok is false for one that is
// skipped (blank, or on an unknown property).
func parseCondition(expr, tok string) (c Condition, ok bool, err error) {
	bad := func(reason string) (Condition, bool, error) {
		return Condition{}, false, &SyntaxError{Expr: expr, Token: tok, Reason: reason}
	}
	if strings.TrimSpace(tok) == "" {
		return Condition{}, false, nil
	}
	i := strings.IndexAny(tok, "<>=!")
	if i < 0 {
		return bad("no operator (= != < <= > >=)")
	}
	c.Property, c.Value = Property(tok[:i]), tok[i:]
	for _, op := range node.Ops() {
		if v, found := strings.CutPrefix(c.Value, string(op)); found {
			c.Op, c.Value = op, v
			break
		}
	}
	switch c.Property {
	case PropCUDA, PropDriver, PropArch:
		if _, ok := requirementVersion(c.Value); !ok {
			return bad("value is not a version (1 to 3 numbers, a leading v allowed)")
		}
	case PropBrand:
	default:
		return Condition{}, false, nil
	}
	return c, true, nil
}

// requirementVersion returns v as the semantic version a requirement
// compares ("v12.2"), and whether it is one.
func requirementVersion(v string) (string, bool) {
	sv := "v" + strings.TrimPrefix(v, "v")
	return sv, semver.IsValid(sv)
}

// driverVersion returns a driver version as requirements compare it: each
// component without leading zeros ("535.104.05" is "535.104.5"); "" when v
// is not digits separated by dots.
func driverVersion(v string) string {
	parts := strings.Split(strings.TrimSpace(v), ".")
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil || strings.TrimLeft(p, "0123456789") != "" {
			return ""
		}
		parts[i] = strconv.FormatUint(n, 10)
	}
	out := strings.Join(parts, ".")
	if _, ok := requirementVersion(out); !ok {
		return ""
	}
	return out
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

// holds evaluates c. Conditions on a GPU property hold trivially when no
// GPU is given (there is nothing to contradict them). An unknown version
// (a driver that reports no CUDA version) compares below every version, as
// in NVIDIA's runtime: "cuda>=11" fails and "cuda<11" holds.
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
		switch c.Op {
		case node.OpEqual, node.OpNotEqual:
			return strings.EqualFold(f.brand, c.Value) == (c.Op == node.OpEqual)
		}
		return c.Op.Holds(strings.Compare(strings.ToLower(f.brand), strings.ToLower(c.Value)))
	}
	want, _ := requirementVersion(c.Value)
	return c.Op.Holds(semver.Compare("v"+strings.TrimPrefix(have, "v"), want))
}

// Requirements returns the image's requirements, as NVIDIA's runtime
// collects them: every NVIDIA_REQUIRE_* variable but NVIDIA_REQUIRE_JETPACK*
// that holds a known condition; "cuda>=<major.minor>" implied by
// CUDA_VERSION when NVIDIA_REQUIRE_CUDA is unset or empty (a blank one
// counts as set); "cuda>=<major.minor>" for the com.nvidia.cuda.version
// label of nvidia-docker 1.0 images (an empty label means no check). None
// when NVIDIA_DISABLE_REQUIRE is true. A requirement that does not parse is
// an error; the image is then refused, not run unchecked.
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
		if strings.HasPrefix(k, EnvRequirePrefix) && !strings.HasPrefix(k, envRequireJetpack) {
			if _, dup := env[k]; !dup {
				names = append(names, k)
			}
			env[k] = v
		}
	}
	slices.Sort(names)
	var reqs []Requirement
	for _, k := range names {
		r, err := ParseRequirement(k, env[k])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		if len(r.Alternatives) > 0 {
			reqs = append(reqs, r)
		}
	}
	if env[EnvRequireCUDA] == "" {
		if v, ok := img.Getenv(EnvCUDAVersion); ok && v != "" {
			r, err := impliedCUDA(EnvCUDAVersion, v)
			if err != nil {
				return nil, err
			}
			reqs = append(reqs, r)
		}
	}
	if v, ok := img.Labels[LabelCUDAVersion]; ok && strings.TrimSpace(v) != "" {
		r, err := impliedCUDA(LabelCUDAVersion, strings.TrimSpace(v))
		if err != nil {
			return nil, err
		}
		reqs = append(reqs, r)
	}
	return reqs, nil
}

// impliedCUDA turns "11.0.3" into "cuda>=11.0", as NVIDIA's runtime reads
// CUDA_VERSION: a semantic version (a leading "v" allowed; "12.2.0.1",
// "12.2x" and " 12.2" are errors) whose major and minor numbers fit in 32
// bits.
func impliedCUDA(source, v string) (Requirement, error) {
	bad := func(reason string) (Requirement, error) {
		return Requirement{}, fmt.Errorf("%s=%q: %w", source, v, &SyntaxError{Expr: v, Token: v, Reason: reason})
	}
	sv, ok := requirementVersion(v)
	if !ok {
		return bad("not a version (1 to 3 numbers, a leading v allowed)")
	}
	mm := strings.TrimPrefix(semver.MajorMinor(sv), "v")
	major, minor, _ := strings.Cut(mm, ".")
	for _, n := range []string{major, minor} {
		if _, err := strconv.ParseUint(n, 10, 32); err != nil {
			return bad("major or minor number past 32 bits")
		}
	}
	c := Condition{Property: PropCUDA, Op: node.OpGreaterEqual, Value: mm}
	return Requirement{Source: source, Expr: c.String(), Alternatives: [][]Condition{{c}}}, nil
}

// NVIDIA's runtime has two readers of requirements: libnvidia-container
// (the nvidia-container-cli behind the legacy hook) and the NVIDIA Container
// Toolkit's own parser (its CDI and CSV paths). Where they disagree, this
// package follows:
//
//   - syntax, and which alternatives count: the toolkit (see
//     ParseRequirement). An alternative whose conditions are all on unknown
//     properties is dropped, as the toolkit drops it; it does not become an
//     empty alternative that always holds.
//   - versions: the toolkit's semantic versions. libnvidia-container reads a
//     version as 32-bit numbers component by component, so the two answer
//     differently for a leading "v", a fourth component, trailing text, a
//     component past 32 bits and an empty component. CUDA_VERSION is read
//     as the toolkit reads it: a semantic version whose major and minor
//     fit in 32 bits, a leading "v" allowed, nothing trimmed.
//   - a driver that reports no CUDA version: the toolkit; the unknown
//     version compares below every version.
//   - separators: a single space, as both split; a tab is part of a
//     condition, which then does not parse.
//   - brands: libnvidia-container's driver path, which names only Quadro,
//     Tesla, NVS, GRID, GeForce and TITAN and reads every other brand as
//     Unknown (so brand=nvidiartx never holds), compared without regard to
//     case. The toolkit's CDI path also names the newer brands (nvidiartx,
//     geforcertx, ...) and compares lower-case names exactly.
//   - arch: libnvidia-container, which checks every GPU of the container;
//     the toolkit checks only the first visible GPU.
//   - the com.nvidia.cuda.version label of nvidia-docker 1.0 images: read
//     as an implied "cuda>=" requirement, as nvidia-docker read it; the
//     toolkit ignores it.

// Check checks the image's requirements against the driver and the GPUs
// allocated to the container: every requirement must hold for the driver and
// for each GPU. The first one that does not gives an *UnmetError naming it
// and the values it was checked against.
func Check(img Image, drv Driver, gpus []node.Device) error {
	reqs, err := img.Requirements()
	if err != nil {
		return err
	}
	f := facts{driver: driverVersion(drv.Version)}
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
