package node

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// SignalKind is one kind of health signal a GPU's driver gives.
type SignalKind int

// The signal kinds. Only SignalXID and SignalRecoveryAction rules match on
// the signal's value; for the others the value is data (a link, a count).
const (
	// SignalXID: an XID error event; the value is the XID.
	SignalXID SignalKind = iota + 1
	// SignalDoubleBitECC: a double-bit (uncorrectable) ECC error event.
	SignalDoubleBitECC
	// SignalRecoveryAction: the driver's recovery action (NVML's
	// GPU_RECOVERY_ACTION field, and its change event); the value is
	// NVML's action (RecoveryNone, RecoveryGPUReset, ...).
	SignalRecoveryAction
	// SignalRowRemapPending: a row remapping is waiting for a reset.
	SignalRowRemapPending
	// SignalRowRemapFailed: a row remapping failed.
	SignalRowRemapFailed
	// SignalRetiredPagesPending: a page retirement is waiting for a reset.
	SignalRetiredPagesPending
	// SignalNVLinkDown: an NVLink is down; the value is the link.
	SignalNVLinkDown
	// SignalNVLinkErrors: NVLink error counters rose; the value is by how
	// much.
	SignalNVLinkErrors
	// SignalPCIeReplay: the PCIe replay counter rose; the value is by how
	// much.
	SignalPCIeReplay
	// SignalThermalSlowdown: clocks are held down for heat.
	SignalThermalSlowdown
	// SignalPowerSlowdown: clocks are held down by a power cap or brake.
	SignalPowerSlowdown
	// SignalLost: the GPU fell off the bus (NVML's ERROR_GPU_IS_LOST).
	SignalLost
)

// signalNames are the kinds' names, as Signal.String and ParseSignal
// write and read them.
var signalNames = map[SignalKind]string{
	SignalXID:                 "xid",
	SignalDoubleBitECC:        "ecc-double-bit",
	SignalRecoveryAction:      "recovery-action",
	SignalRowRemapPending:     "row-remap-pending",
	SignalRowRemapFailed:      "row-remap-failed",
	SignalRetiredPagesPending: "retired-pages-pending",
	SignalNVLinkDown:          "nvlink-down",
	SignalNVLinkErrors:        "nvlink-errors",
	SignalPCIeReplay:          "pcie-replay",
	SignalThermalSlowdown:     "thermal-slowdown",
	SignalPowerSlowdown:       "power-slowdown",
	SignalLost:                "lost",
}

// SignalKinds are every kind, in order.
func SignalKinds() []SignalKind {
	out := make([]SignalKind, 0, len(signalNames))
	for k := SignalXID; k <= SignalLost; k++ {
		out = append(out, k)
	}
	return out
}

func (k SignalKind) String() string {
	if s, ok := signalNames[k]; ok {
		return s
	}
	return "signal(" + strconv.Itoa(int(k)) + ")"
}

// valued tells whether rules of kind k match on the signal's value.
func (k SignalKind) valued() bool { return k == SignalXID || k == SignalRecoveryAction }

// known tells whether k is one of the kinds above.
func (k SignalKind) known() bool { _, ok := signalNames[k]; return ok }

// NVML's recovery actions (nvmlDeviceGpuRecoveryAction_t), the values of a
// SignalRecoveryAction.
const (
	RecoveryNone              uint64 = 0
	RecoveryGPUReset          uint64 = 1
	RecoveryNodeReboot        uint64 = 2
	RecoveryDrainP2P          uint64 = 3
	RecoveryDrainAndReset     uint64 = 4
	RecoveryRecoverIMEXDomain uint64 = 5
)

// Signal is one health signal of a GPU or MIG device.
type Signal struct {
	Kind  SignalKind
	Value uint64
}

// String writes s as ParseSignal reads it: "xid 79", "lost".
func (s Signal) String() string {
	if s.Kind.valued() || s.Value != 0 {
		return s.Kind.String() + " " + strconv.FormatUint(s.Value, 10)
	}
	return s.Kind.String()
}

// ParseSignal reads a signal as "<kind> [value]": "xid 79",
// "recovery-action 1", "nvlink-down 3", "lost". Kinds are read without
// regard to case; XID and recovery-action signals need their value. Bad
// input is a *HealthRuleError.
func ParseSignal(text string) (Signal, error) {
	f := strings.Fields(text)
	if len(f) == 0 || len(f) > 2 {
		return Signal{}, &HealthRuleError{Text: text, Reason: `want "<signal> [value]"`}
	}
	k, ok := parseKind(f[0])
	if !ok {
		return Signal{}, &HealthRuleError{Text: text, Reason: "unknown signal " + strconv.Quote(f[0])}
	}
	s := Signal{Kind: k}
	if len(f) == 1 {
		if k.valued() {
			return Signal{}, &HealthRuleError{Text: text, Reason: k.String() + " needs a value"}
		}
		return s, nil
	}
	v, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return Signal{}, &HealthRuleError{Text: text, Reason: "value " + strconv.Quote(f[1]) + " is not a number"}
	}
	s.Value = v
	return s, nil
}

func parseKind(s string) (SignalKind, bool) {
	s = strings.ToLower(s)
	for k, name := range signalNames {
		if name == s {
			return k, true
		}
	}
	return 0, false
}

// HealthState is what a signal makes of a device.
type HealthState int

// The states.
const (
	// StateHealthy: nothing to do.
	StateHealthy HealthState = iota
	// StateInform: shown (reported, a taint of effect None) but not acted
	// on: the device stays in service.
	StateInform
	// StateUnhealthy: the device is taken out of service until the signal
	// clears.
	StateUnhealthy
)

var stateNames = [...]string{"healthy", "inform", "unhealthy"}

func (s HealthState) String() string {
	if s >= 0 && int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// Action is what must be done for a device to recover.
type Action int

// The actions, from the least to the most disruptive.
const (
	// ActionNone: nothing.
	ActionNone Action = iota
	// ActionRestartApp: the application that met the error restarts; the
	// GPU is fine.
	ActionRestartApp
	// ActionDrain: no new work; running work goes on until it ends.
	ActionDrain
	// ActionResetGPU: the GPU is reset (no process may hold it).
	ActionResetGPU
	// ActionReboot: the node is rebooted.
	ActionReboot
)

var actionNames = [...]string{"none", "restart-app", "drain", "reset-gpu", "reboot"}

func (a Action) String() string {
	if a >= 0 && int(a) < len(actionNames) {
		return actionNames[a]
	}
	return "action(" + strconv.Itoa(int(a)) + ")"
}

func parseIndex(names []string, s string) (int, bool) {
	i := slices.Index(names, strings.ToLower(s))
	return i, i >= 0
}

// HealthRule maps signals of one kind (and, for XID and recovery-action
// signals, one value, or every value no other rule names: Any) to a state
// and an action.
type HealthRule struct {
	Kind SignalKind
	// Value is the XID or recovery action the rule matches; only for
	// SignalXID and SignalRecoveryAction, and not with Any.
	Value uint64
	// Any makes a SignalXID or SignalRecoveryAction rule match every value
	// that no rule of the same kind names.
	Any    bool
	State  HealthState
	Action Action
	// Reason is a few words on what the signal means ("contained ECC
	// error"); optional.
	Reason string
}

// String writes r as ParseHealthRules reads it:
// "xid 94 inform restart-app contained ECC error".
func (r HealthRule) String() string {
	sig := r.Kind.String()
	switch {
	case r.Any:
		sig += " *"
	case r.Kind.valued():
		sig += " " + strconv.FormatUint(r.Value, 10)
	}
	s := sig + " " + r.State.String() + " " + r.Action.String()
	if r.Reason != "" {
		s += " " + r.Reason
	}
	return s
}

// matches tells whether r names s exactly (an Any rule names nothing).
func (r HealthRule) matches(s Signal) bool {
	return r.Kind == s.Kind && !r.Any && (!r.Kind.valued() || r.Value == s.Value)
}

// validate checks one rule.
func (r HealthRule) validate() string {
	switch {
	case !r.Kind.known():
		return "unknown signal " + r.Kind.String()
	case r.Any && !r.Kind.valued():
		return r.Kind.String() + " rules take no value, so no \"*\""
	case r.Any && r.Value != 0:
		return "a \"*\" rule names no value"
	case !r.Kind.valued() && r.Value != 0:
		return r.Kind.String() + " rules take no value"
	case r.State < StateHealthy || r.State > StateUnhealthy:
		return "unknown state " + r.State.String()
	case r.Action < ActionNone || r.Action > ActionReboot:
		return "unknown action " + r.Action.String()
	case r.State == StateHealthy && r.Action != ActionNone:
		return "a healthy signal needs no action"
	case r.State == StateUnhealthy && r.Action == ActionNone:
		return "an unhealthy signal needs an action"
	case strings.ContainsAny(r.Reason, "\n\r"):
		return "a reason is one line"
	}
	return ""
}

// HealthTable maps every signal to a state and an action. A later rule
// overrides an earlier one for the same signal, so a caller extends or
// replaces the default (DefaultHealthTable) by appending rules. A table is
// whole when it has a rule for every kind (for XID and recovery-action
// signals, an Any rule): Validate checks.
type HealthTable []HealthRule

// Validate checks every rule and that the table is whole; the problems are
// *HealthRuleErrors (matching node.ErrInvalid), joined.
func (t HealthTable) Validate() error {
	var errs []error
	for i, r := range t {
		if why := r.validate(); why != "" {
			errs = append(errs, &HealthRuleError{Rule: i + 1, Text: r.String(), Reason: why})
		}
	}
	for _, k := range SignalKinds() {
		if !slices.ContainsFunc(t, func(r HealthRule) bool { return r.Kind == k && (r.Any || !k.valued()) }) {
			why := "no rule for " + k.String()
			if k.valued() {
				why = "no rule for every other " + k.String() + ` ("` + k.String() + ` *")`
			}
			errs = append(errs, &HealthRuleError{Reason: why})
		}
	}
	return errors.Join(errs...)
}

// Rule is the rule that applies to s: the last rule naming it, else the
// last Any rule of its kind; false when there is none.
func (t HealthTable) Rule(s Signal) (HealthRule, bool) {
	for i := len(t) - 1; i >= 0; i-- {
		if t[i].matches(s) {
			return t[i], true
		}
	}
	for i := len(t) - 1; i >= 0; i-- {
		if t[i].Kind == s.Kind && t[i].Any {
			return t[i], true
		}
	}
	return HealthRule{}, false
}

// Classify is what s makes of a device by t. A signal no rule covers (a
// table that is not whole) makes it unhealthy, to be drained.
func (t HealthTable) Classify(s Signal) Verdict {
	r, ok := t.Rule(s)
	if !ok {
		r = HealthRule{State: StateUnhealthy, Action: ActionDrain, Reason: "no rule"}
	}
	return Verdict{Signal: s, State: r.State, Action: r.Action, Reason: r.Reason}
}

// Rules are t's rules in effect, one per signal (or Any) named, in the
// order of kinds and values: what a table says, overrides applied.
func (t HealthTable) Rules() []HealthRule {
	var out []HealthRule
	for _, r := range t {
		i := slices.IndexFunc(out, func(o HealthRule) bool { return o.Kind == r.Kind && o.Any == r.Any && o.Value == r.Value })
		if i >= 0 {
			out[i] = r
		} else {
			out = append(out, r)
		}
	}
	slices.SortStableFunc(out, func(a, b HealthRule) int {
		switch {
		case a.Kind != b.Kind:
			return int(a.Kind) - int(b.Kind)
		case a.Any != b.Any:
			if a.Any {
				return 1
			}
			return -1
		case a.Value < b.Value:
			return -1
		case a.Value > b.Value:
			return 1
		}
		return 0
	})
	return out
}

// ParseHealthRules reads rules, one a line, as HealthRule.String writes
// them: "<signal> [value|*] <state> <action> [reason...]". Blank lines
// and lines starting with "#" are skipped. Every bad line is a
// *HealthRuleError naming it; they are joined and no rule is returned.
func ParseHealthRules(text string) (HealthTable, error) {
	var out HealthTable
	var errs []error
	for n, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		r, why := parseRule(line)
		if why == "" {
			why = r.validate()
		}
		if why != "" {
			errs = append(errs, &HealthRuleError{Rule: n + 1, Text: line, Reason: why})
			continue
		}
		out = append(out, r)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

func parseRule(line string) (HealthRule, string) {
	f := strings.Fields(line)
	if len(f) < 3 {
		return HealthRule{}, `want "<signal> [value|*] <state> <action> [reason]"`
	}
	k, ok := parseKind(f[0])
	if !ok {
		return HealthRule{}, "unknown signal " + strconv.Quote(f[0])
	}
	r := HealthRule{Kind: k}
	rest := f[1:]
	if k.valued() {
		switch v := rest[0]; {
		case v == "*":
			r.Any = true
		default:
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return HealthRule{}, "value " + strconv.Quote(v) + ` is neither a number nor "*"`
			}
			r.Value = n
		}
		rest = rest[1:]
	}
	if len(rest) < 2 {
		return HealthRule{}, "want a state and an action"
	}
	st, ok := parseIndex(stateNames[:], rest[0])
	if !ok {
		return HealthRule{}, "unknown state " + strconv.Quote(rest[0]) + " (healthy, inform, unhealthy)"
	}
	ac, ok := parseIndex(actionNames[:], rest[1])
	if !ok {
		return HealthRule{}, "unknown action " + strconv.Quote(rest[1]) + " (" + strings.Join(actionNames[:], ", ") + ")"
	}
	r.State, r.Action = HealthState(st), Action(ac)
	r.Reason = strings.Join(rest[2:], " ")
	return r, ""
}

// Verdict is what one signal makes of a device.
type Verdict struct {
	Signal Signal
	State  HealthState
	Action Action
	// Reason is the rule's, possibly empty.
	Reason string
}

// String is the verdict as a device's health reason:
// "XID 79 (fallen off the bus): reset-gpu". The XID form ("XID <n>") is
// the one health reasons always had.
func (v Verdict) String() string {
	var s string
	switch v.Signal.Kind {
	case SignalXID:
		s = "XID " + strconv.FormatUint(v.Signal.Value, 10)
	case SignalDoubleBitECC:
		s = "double-bit ECC error"
	case SignalLost:
		s = "GPU is lost"
	default:
		s = v.Signal.String()
	}
	if v.Reason != "" {
		s += " (" + v.Reason + ")"
	}
	return s + ": " + v.Action.String()
}

// VerdictAction is the action of a health reason that a Verdict wrote
// (Verdict.String: "...: <action>"); false for any other reason, an
// operator's.
func VerdictAction(reason string) (Action, bool) {
	i := strings.LastIndex(reason, ": ")
	if i < 0 {
		return 0, false
	}
	a, ok := parseIndex(actionNames[:], reason[i+2:])
	if !ok || Action(a) == ActionNone || reason[i+2:] != actionNames[a] {
		return 0, false
	}
	return Action(a), true
}

// Health is the device health the verdict gives: unhealthy for
// StateUnhealthy, healthy otherwise.
func (v Verdict) Health() Health {
	if v.State == StateUnhealthy {
		return Unhealthy(v.String())
	}
	return Healthy()
}

// DefaultHealthTable is gpuiso's table, after NVIDIA's XID catalog
// (each XID's immediate resolution: RESTART_APP, RESET_GPU, ...) and the
// driver's recovery actions. A fresh copy on each call: the caller's to
// extend.
//
// An XID whose fix is restarting the application (13, 31, 43, 45, 68, 69,
// 94: the error stayed in one process) only informs; an XID that needs a
// reset (48, 62, 64, 74, 79, 95, 109, 119, 120, 140) makes the GPU
// unhealthy until the driver says no action is needed; 63 and 92 (a
// remapping recorded, a high single-bit rate) drain it; 154 (the recovery
// action changed) informs, the action itself comes with
// SignalRecoveryAction. Any other XID drains the GPU.
func DefaultHealthTable() HealthTable {
	x := func(xid uint64, st HealthState, ac Action, why string) HealthRule {
		return HealthRule{Kind: SignalXID, Value: xid, State: st, Action: ac, Reason: why}
	}
	ra := func(v uint64, st HealthState, ac Action, why string) HealthRule {
		return HealthRule{Kind: SignalRecoveryAction, Value: v, State: st, Action: ac, Reason: why}
	}
	k := func(kind SignalKind, st HealthState, ac Action, why string) HealthRule {
		return HealthRule{Kind: kind, State: st, Action: ac, Reason: why}
	}
	return HealthTable{
		x(13, StateInform, ActionRestartApp, "graphics engine exception"),
		x(31, StateInform, ActionRestartApp, "memory page fault"),
		x(43, StateInform, ActionRestartApp, "GPU stopped processing"),
		x(45, StateInform, ActionNone, "preemptive cleanup"),
		x(48, StateUnhealthy, ActionResetGPU, "double-bit ECC error"),
		x(62, StateUnhealthy, ActionResetGPU, "internal micro-controller halt"),
		x(63, StateUnhealthy, ActionDrain, "row remapping or page retirement recorded"),
		x(64, StateUnhealthy, ActionResetGPU, "row remapping or page retirement failed"),
		x(68, StateInform, ActionRestartApp, "video processor exception"),
		x(69, StateInform, ActionRestartApp, "graphics engine class error"),
		x(74, StateUnhealthy, ActionResetGPU, "NVLink error"),
		x(79, StateUnhealthy, ActionResetGPU, "fallen off the bus"),
		x(92, StateUnhealthy, ActionDrain, "high single-bit ECC error rate"),
		x(94, StateInform, ActionRestartApp, "contained ECC error"),
		x(95, StateUnhealthy, ActionResetGPU, "uncontained ECC error"),
		x(109, StateUnhealthy, ActionResetGPU, "context switch timeout"),
		x(119, StateUnhealthy, ActionResetGPU, "GSP RPC timeout"),
		x(120, StateUnhealthy, ActionResetGPU, "GSP error"),
		x(140, StateUnhealthy, ActionResetGPU, "unrecovered ECC error"),
		x(154, StateInform, ActionNone, "recovery action changed"),
		{Kind: SignalXID, Any: true, State: StateUnhealthy, Action: ActionDrain, Reason: "an XID of no other rule"},
		ra(RecoveryNone, StateHealthy, ActionNone, "no action needed"),
		ra(RecoveryGPUReset, StateUnhealthy, ActionResetGPU, "the driver asks for a GPU reset"),
		ra(RecoveryNodeReboot, StateUnhealthy, ActionReboot, "the driver asks for a reboot"),
		ra(RecoveryDrainP2P, StateUnhealthy, ActionDrain, "the driver asks to drain peer-to-peer work"),
		ra(RecoveryDrainAndReset, StateUnhealthy, ActionResetGPU, "the driver asks to drain, then reset"),
		{Kind: SignalRecoveryAction, Any: true, State: StateUnhealthy, Action: ActionDrain, Reason: "the driver asks for an action"},
		k(SignalDoubleBitECC, StateUnhealthy, ActionResetGPU, "uncorrectable memory error"),
		k(SignalRowRemapPending, StateUnhealthy, ActionResetGPU, "a remapped row waits for a reset"),
		k(SignalRowRemapFailed, StateUnhealthy, ActionDrain, "the GPU needs service"),
		k(SignalRetiredPagesPending, StateUnhealthy, ActionResetGPU, "a retired page waits for a reset"),
		k(SignalNVLinkDown, StateUnhealthy, ActionDrain, "a link is down"),
		k(SignalNVLinkErrors, StateInform, ActionNone, "link errors counted"),
		k(SignalPCIeReplay, StateInform, ActionNone, "PCIe replays counted"),
		k(SignalThermalSlowdown, StateInform, ActionNone, "clocks held down for heat"),
		k(SignalPowerSlowdown, StateInform, ActionNone, "clocks held down for power"),
		k(SignalLost, StateUnhealthy, ActionResetGPU, "fallen off the bus"),
	}
}

// HealthRuleError is a health rule or signal that does not read or does
// not hold, or a table that is not whole (Rule 0). It matches
// node.ErrInvalid.
type HealthRuleError struct {
	// Rule is the rule's line or position, from 1; 0 for the table.
	Rule int
	// Text is the rule or signal as given.
	Text   string
	Reason string
}

func (e *HealthRuleError) Error() string {
	switch {
	case e.Rule > 0:
		return fmt.Sprintf("health rule %d %q: %s", e.Rule, e.Text, e.Reason)
	case e.Text != "":
		return fmt.Sprintf("health signal %q: %s", e.Text, e.Reason)
	}
	return "health table: " + e.Reason
}

// Is makes errors.Is(err, ErrInvalid) hold.
func (e *HealthRuleError) Is(target error) bool { return target == ErrInvalid }
