package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"
)

// TestOwnCgroup: a container the runtime isolates gets a cgroup named
// after its owner (its id and runc root) where the engine named none, in
// the form of runc's cgroup driver, and keeps the engine's own; the patched
// config.json says so, and changes no other byte.
func TestOwnCgroup(t *testing.T) {
	const owner = "c1.0123456789ab"
	for _, tc := range []struct {
		name     string
		config   string
		runcArgs []string
		want     string
	}{
		{name: "none", config: `{"linux":{"devices":[]}}`, want: owner},
		{name: "empty", config: `{"linux":{"cgroupsPath":"","devices":[]}}`, want: owner},
		{name: "no linux", config: `{"ociVersion":"1.2.0"}`, want: owner},
		{name: "systemd", config: `{"linux":{}}`, runcArgs: []string{"--root", "/r", "--systemd-cgroup"}, want: ":runc:" + owner},
		{name: "systemd off", config: `{"linux":{}}`, runcArgs: []string{"--systemd-cgroup=false"}, want: owner},
		{name: "the engine's", config: `{"linux":{"cgroupsPath":"/docker/c1"}}`, want: "/docker/c1"},
		{name: "the engine's, systemd", config: `{"linux":{"cgroupsPath":"system.slice:libpod:c1"}}`, runcArgs: []string{"--systemd-cgroup"}, want: "system.slice:libpod:c1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var spec specs.Spec
			if err := json.Unmarshal([]byte(tc.config), &spec); err != nil {
				t.Fatal(err)
			}
			ownCgroup(&spec, owner, tc.runcArgs)
			if spec.Linux.CgroupsPath != tc.want {
				t.Errorf("cgroupsPath %q, want %q", spec.Linux.CgroupsPath, tc.want)
			}
			out, err := patchSpec([]byte(tc.config), &spec)
			if err != nil {
				t.Fatal(err)
			}
			var got specs.Spec
			if err := json.Unmarshal(out, &got); err != nil || got.Linux == nil || got.Linux.CgroupsPath != tc.want {
				t.Errorf("patched: %v\n%s", err, out)
			}
			if strings.HasPrefix(tc.want, "/docker") || strings.HasPrefix(tc.want, "system.slice") {
				if string(out) != tc.config {
					t.Errorf("the engine's config changed:\n%s", out)
				}
			}
		})
	}
}
