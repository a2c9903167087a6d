package node_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/node"
)

func TestDefaultHealthTable(t *testing.T) {
	table := node.DefaultHealthTable()
	if err := table.Validate(); err != nil {
		t.Fatalf("the default table does not hold: %v", err)
	}
	tests := []struct {
		name   string
		signal node.Signal
		state  node.HealthState
		action node.Action
	}{
		{"contained ECC error restarts the application", node.Signal{Kind: node.SignalXID, Value: 94}, node.StateInform, node.ActionRestartApp},
		{"context switch timeout needs a reset", node.Signal{Kind: node.SignalXID, Value: 109}, node.StateUnhealthy, node.ActionResetGPU},
		{"graphics engine exception", node.Signal{Kind: node.SignalXID, Value: 13}, node.StateInform, node.ActionRestartApp},
		{"memory page fault", node.Signal{Kind: node.SignalXID, Value: 31}, node.StateInform, node.ActionRestartApp},
		{"fallen off the bus", node.Signal{Kind: node.SignalXID, Value: 79}, node.StateUnhealthy, node.ActionResetGPU},
		{"double-bit ECC XID", node.Signal{Kind: node.SignalXID, Value: 48}, node.StateUnhealthy, node.ActionResetGPU},
		{"uncontained ECC error", node.Signal{Kind: node.SignalXID, Value: 95}, node.StateUnhealthy, node.ActionResetGPU},
		{"remapping recorded drains", node.Signal{Kind: node.SignalXID, Value: 63}, node.StateUnhealthy, node.ActionDrain},
		{"recovery action changed informs", node.Signal{Kind: node.SignalXID, Value: 154}, node.StateInform, node.ActionNone},
		{"an XID of no rule drains", node.Signal{Kind: node.SignalXID, Value: 999}, node.StateUnhealthy, node.ActionDrain},
		{"recovery action none", node.Signal{Kind: node.SignalRecoveryAction, Value: node.RecoveryNone}, node.StateHealthy, node.ActionNone},
		{"recovery action reset", node.Signal{Kind: node.SignalRecoveryAction, Value: node.RecoveryGPUReset}, node.StateUnhealthy, node.ActionResetGPU},
		{"recovery action reboot", node.Signal{Kind: node.SignalRecoveryAction, Value: node.RecoveryNodeReboot}, node.StateUnhealthy, node.ActionReboot},
		{"recovery action drain P2P", node.Signal{Kind: node.SignalRecoveryAction, Value: node.RecoveryDrainP2P}, node.StateUnhealthy, node.ActionDrain},
		{"recovery action drain and reset", node.Signal{Kind: node.SignalRecoveryAction, Value: node.RecoveryDrainAndReset}, node.StateUnhealthy, node.ActionResetGPU},
		{"recovery action of a newer driver", node.Signal{Kind: node.SignalRecoveryAction, Value: node.RecoveryRecoverIMEXDomain}, node.StateUnhealthy, node.ActionDrain},
		{"double-bit ECC event", node.Signal{Kind: node.SignalDoubleBitECC}, node.StateUnhealthy, node.ActionResetGPU},
		{"row remap pending", node.Signal{Kind: node.SignalRowRemapPending}, node.StateUnhealthy, node.ActionResetGPU},
		{"row remap failed", node.Signal{Kind: node.SignalRowRemapFailed}, node.StateUnhealthy, node.ActionDrain},
		{"retired pages pending", node.Signal{Kind: node.SignalRetiredPagesPending}, node.StateUnhealthy, node.ActionResetGPU},
		{"NVLink down", node.Signal{Kind: node.SignalNVLinkDown, Value: 3}, node.StateUnhealthy, node.ActionDrain},
		{"NVLink errors", node.Signal{Kind: node.SignalNVLinkErrors, Value: 12}, node.StateInform, node.ActionNone},
		{"PCIe replays", node.Signal{Kind: node.SignalPCIeReplay, Value: 5}, node.StateInform, node.ActionNone},
		{"thermal slowdown", node.Signal{Kind: node.SignalThermalSlowdown}, node.StateInform, node.ActionNone},
		{"power slowdown", node.Signal{Kind: node.SignalPowerSlowdown}, node.StateInform, node.ActionNone},
		{"lost", node.Signal{Kind: node.SignalLost}, node.StateUnhealthy, node.ActionResetGPU},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := table.Classify(tt.signal)
			if v.State != tt.state || v.Action != tt.action {
				t.Errorf("%s: %s %s, want %s %s", tt.signal, v.State, v.Action, tt.state, tt.action)
			}
			if got := v.Health().Healthy; got != (tt.state != node.StateUnhealthy) {
				t.Errorf("%s: healthy %v", tt.signal, got)
			}
		})
	}
	// Every kind is covered, and fresh on each call.
	table[0].State = node.StateUnhealthy
	if node.DefaultHealthTable()[0].State == node.StateUnhealthy {
		t.Error("DefaultHealthTable shares its rules between callers")
	}
}

func TestHealthTableOverride(t *testing.T) {
	extra, err := node.ParseHealthRules(`
# XID 94 taken out of service on this fleet, XID 200 only shown.
xid 94 unhealthy drain contained ECC error, drained here
xid 200 inform none
thermal-slowdown unhealthy drain too hot
`)
	if err != nil {
		t.Fatal(err)
	}
	table := append(node.DefaultHealthTable(), extra...)
	if err := table.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		signal node.Signal
		state  node.HealthState
		action node.Action
	}{
		{node.Signal{Kind: node.SignalXID, Value: 94}, node.StateUnhealthy, node.ActionDrain},
		{node.Signal{Kind: node.SignalXID, Value: 200}, node.StateInform, node.ActionNone},
		{node.Signal{Kind: node.SignalThermalSlowdown}, node.StateUnhealthy, node.ActionDrain},
		{node.Signal{Kind: node.SignalXID, Value: 109}, node.StateUnhealthy, node.ActionResetGPU},
	} {
		if v := table.Classify(tt.signal); v.State != tt.state || v.Action != tt.action {
			t.Errorf("%s: %s %s, want %s %s", tt.signal, v.State, v.Action, tt.state, tt.action)
		}
	}
	// Rules lists the rules in effect: the override, once.
	var n94 int
	for _, r := range table.Rules() {
		if r.Kind == node.SignalXID && r.Value == 94 && !r.Any {
			n94++
			if r.State != node.StateUnhealthy {
				t.Errorf("Rules keeps the overridden rule: %s", r)
			}
		}
	}
	if n94 != 1 {
		t.Errorf("XID 94 listed %d times", n94)
	}
	// The table's text reads back as the same rules.
	var text strings.Builder
	for _, r := range table.Rules() {
		text.WriteString(r.String() + "\n")
	}
	back, err := node.ParseHealthRules(text.String())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(back), len(table.Rules()); got != want {
		t.Fatalf("read back %d rules, want %d", got, want)
	}
	for i, r := range table.Rules() {
		if back[i] != r {
			t.Errorf("rule %d read back as %+v, want %+v", i, back[i], r)
		}
	}
}

func TestHealthRulesInvalid(t *testing.T) {
	for _, text := range []string{
		"xid",
		"xid 94",
		"xid ninety inform none",
		"xid 94 sick none",
		"xid 94 inform replace",
		"teleport inform none",
		"lost * unhealthy reboot",
		"lost healthy reboot",
		"xid 3 unhealthy none",
		"recovery-action * healthy drain",
	} {
		t.Run(text, func(t *testing.T) {
			rules, err := node.ParseHealthRules("xid 1 inform none\n" + text)
			var re *node.HealthRuleError
			if !errors.As(err, &re) || !errors.Is(err, node.ErrInvalid) {
				t.Fatalf("%q: %v, want a *HealthRuleError", text, err)
			}
			if re.Rule != 2 || rules != nil {
				t.Errorf("%q: rule %d, rules %v: want line 2 named and no rules", text, re.Rule, rules)
			}
		})
	}
	// A table without every kind covered does not hold.
	var table node.HealthTable
	for _, r := range node.DefaultHealthTable() {
		if r.Kind != node.SignalLost && !(r.Kind == node.SignalXID && r.Any) {
			table = append(table, r)
		}
	}
	err := table.Validate()
	if !errors.Is(err, node.ErrInvalid) || !strings.Contains(err.Error(), "lost") || !strings.Contains(err.Error(), `"xid *"`) {
		t.Errorf("a table missing lost and xid *: %v", err)
	}
	bad := append(node.DefaultHealthTable(), node.HealthRule{Kind: node.SignalKind(99), State: node.StateInform})
	var re *node.HealthRuleError
	if err := bad.Validate(); !errors.As(err, &re) || re.Rule != len(bad) {
		t.Errorf("an unknown kind: %v", err)
	}
}

func TestParseSignal(t *testing.T) {
	for text, want := range map[string]node.Signal{
		"xid 79":            {Kind: node.SignalXID, Value: 79},
		"XID 94":            {Kind: node.SignalXID, Value: 94},
		"recovery-action 1": {Kind: node.SignalRecoveryAction, Value: 1},
		"nvlink-down 3":     {Kind: node.SignalNVLinkDown, Value: 3},
		"lost":              {Kind: node.SignalLost},
	} {
		got, err := node.ParseSignal(text)
		if err != nil || got != want {
			t.Errorf("%q: %+v, %v; want %+v", text, got, err, want)
		}
		if back, err := node.ParseSignal(got.String()); err != nil || back != got {
			t.Errorf("%q written %q reads back as %+v, %v", text, got, back, err)
		}
	}
	for _, text := range []string{"", "xid", "xid x", "lost 1 2", "meltdown"} {
		if _, err := node.ParseSignal(text); !errors.Is(err, node.ErrInvalid) {
			t.Errorf("%q: %v, want node.ErrInvalid", text, err)
		}
	}
}

func TestVerdictReason(t *testing.T) {
	v := node.DefaultHealthTable().Classify(node.Signal{Kind: node.SignalXID, Value: 79})
	if got := v.Health().Reason; !strings.HasPrefix(got, "XID 79 ") || !strings.HasSuffix(got, ": reset-gpu") {
		t.Errorf("reason %q: want the XID form and the action", got)
	}
}

func FuzzParseHealthRules(f *testing.F) {
	for _, r := range node.DefaultHealthTable() {
		f.Add(r.String())
	}
	f.Add("xid * unhealthy drain\n# comment\n\nlost inform none")
	f.Fuzz(func(t *testing.T, text string) {
		rules, err := node.ParseHealthRules(text)
		if err != nil {
			if !errors.Is(err, node.ErrInvalid) || rules != nil {
				t.Fatalf("%q: %v with %d rules", text, err, len(rules))
			}
			return
		}
		for _, r := range rules {
			back, err := node.ParseHealthRules(r.String())
			if err != nil || len(back) != 1 || back[0].Kind != r.Kind || back[0].State != r.State || back[0].Action != r.Action {
				t.Fatalf("rule %q reads back as %v, %v", r, back, err)
			}
		}
	})
}

func TestVerdictAction(t *testing.T) {
	for _, s := range node.SignalKinds() {
		v := node.DefaultHealthTable().Classify(node.Signal{Kind: s, Value: 1})
		if v.State != node.StateUnhealthy {
			continue
		}
		if a, ok := node.VerdictAction(v.Health().Reason); !ok || a != v.Action {
			t.Errorf("%q: %s, %v; want %s", v.Health().Reason, a, ok, v.Action)
		}
	}
	for _, reason := range []string{"", "XID 79", "maintenance", "GPU is lost", "disk: none", "x: Drain"} {
		if a, ok := node.VerdictAction(reason); ok {
			t.Errorf("%q taken for a verdict's reason (%s)", reason, a)
		}
	}
}
