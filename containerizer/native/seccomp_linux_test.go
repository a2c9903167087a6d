package native

import (
	"slices"
	"testing"

	bpf "github.com/elastic/go-seccomp-bpf"
)

// TestSeccompPolicy checks the conversion of Docker's default profile: it
// assembles, denies by default, and lets mount and module loading through
// only with the capabilities Docker ties them to.
func TestSeccompPolicy(t *testing.T) {
	allowed := func(p *bpf.Policy, name string) bool {
		for _, g := range p.Syscalls {
			if g.Action != bpf.ActionAllow {
				continue
			}
			if slices.Contains(g.Names, name) || slices.ContainsFunc(g.NamesWithCondtions, func(n bpf.NameWithConditions) bool { return n.Name == name }) {
				return true
			}
		}
		return false
	}
	for _, tc := range []struct {
		name  string
		caps  []string
		allow []string
		deny  []string
	}{
		{name: "default", caps: DefaultCapabilities(), allow: []string{"read", "execve", "clone", "wait4", "setresuid"},
			deny: []string{"mount", "umount2", "init_module", "finit_module", "pivot_root", "kexec_load", "unshare", "setns", "bpf"}},
		{name: "sys_admin", caps: append(DefaultCapabilities(), "CAP_SYS_ADMIN"), allow: []string{"mount", "umount2", "unshare", "setns"},
			deny: []string{"init_module"}},
		{name: "sys_module", caps: append(DefaultCapabilities(), "CAP_SYS_MODULE"), allow: []string{"init_module", "finit_module"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := seccompPolicy(tc.caps)
			if err != nil {
				t.Fatal(err)
			}
			if p.DefaultAction != bpf.ActionErrno {
				t.Errorf("default action %v, want errno (EPERM)", p.DefaultAction)
			}
			if _, err := p.Assemble(); err != nil {
				t.Fatalf("assemble: %v", err)
			}
			for _, s := range tc.allow {
				if !allowed(p, s) {
					t.Errorf("%s is not allowed", s)
				}
			}
			for _, s := range tc.deny {
				if allowed(p, s) {
					t.Errorf("%s is allowed", s)
				}
			}
		})
	}
}
