package main

import (
	"errors"
	"slices"
	"testing"
	"time"
)

func TestSplitArgs(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		cmd      string
		rest     []string
		runcArgs []string
		check    func(t *testing.T, s Settings)
		err      bool
	}{
		{name: "plain", args: []string{"create", "--bundle", "b", "id"}, cmd: "create", rest: []string{"--bundle", "b", "id"}},
		{name: "docker's", args: []string{"--root", "/run/r", "--log", "/l.json", "--log-format", "json", "--systemd-cgroup", "create", "id"},
			cmd: "create", rest: []string{"id"}, runcArgs: []string{"--root", "/run/r", "--log", "/l.json", "--log-format", "json", "--systemd-cgroup"},
			check: func(t *testing.T, s Settings) {
				if s.Log != "/l.json" || s.LogFormat != "json" {
					t.Errorf("log %q format %q", s.Log, s.LogFormat)
				}
			}},
		{name: "own flags taken out", args: []string{"--runc=/usr/bin/runc", "--state-dir", "/s", "-simulate", "pcie8", "--dev-root", "/d", "--root", "/r", "delete", "-f", "id"},
			cmd: "delete", rest: []string{"-f", "id"}, runcArgs: []string{"--root", "/r"},
			check: func(t *testing.T, s Settings) {
				if s.Runc != "/usr/bin/runc" || s.StateDir != "/s" || s.Simulate != "pcie8" || s.DevRoot != "/d" {
					t.Errorf("settings %+v", s)
				}
			}},
		{name: "equals form passed on", args: []string{"--root=/r", "state", "id"}, cmd: "state", rest: []string{"id"}, runcArgs: []string{"--root", "/r"}},
		{name: "no command", args: []string{"--version"}, runcArgs: []string{"--version"}},
		{name: "swarm resources", args: []string{"--swarm-resource", "A", "--swarm-resource=B", "list"}, cmd: "list", rest: []string{},
			check: func(t *testing.T, s Settings) {
				if !slices.Equal(s.SwarmResources, []string{"A", "B"}) {
					t.Errorf("swarm resources %q", s.SwarmResources)
				}
			}},
		{name: "defaults", args: []string{"list"}, cmd: "list", rest: []string{},
			check: func(t *testing.T, s Settings) {
				if s.Runc != "runc" || s.CDIKind != "nvidia.com/gpu" || s.LogFormat != "text" || !slices.Equal(s.SwarmResources, defaultSwarmResources) ||
					s.AcceptEnv != AcceptCaller || s.AcceptCDIAnnotations || s.Timeout != 30*time.Second {
					t.Errorf("settings %+v", s)
				}
			}},
		{name: "cdi annotations", args: []string{"--accept-cdi-annotations=true", "list"}, cmd: "list", rest: []string{},
			check: func(t *testing.T, s Settings) {
				if !s.AcceptCDIAnnotations || len(s.RuncArgs) != 0 {
					t.Errorf("settings %+v", s)
				}
			}},
		{name: "policy and timeout", args: []string{"--accept-env-request", "privileged", "--timeout=1m30s", "list"}, cmd: "list", rest: []string{},
			check: func(t *testing.T, s Settings) {
				if s.AcceptEnv != AcceptPrivileged || s.Timeout != 90*time.Second || len(s.RuncArgs) != 0 {
					t.Errorf("settings %+v", s)
				}
			}},
		{name: "shares", args: []string{"--swarm-memory-resource", "GPU_MEM", "--shared-gpus", "0,GPU-abc", "list"}, cmd: "list", rest: []string{},
			check: func(t *testing.T, s Settings) {
				if s.SwarmMemoryResource != "GPU_MEM" || !slices.Equal(s.SharedGPUs, []string{"0", "GPU-abc"}) || len(s.RuncArgs) != 0 {
					t.Errorf("settings %+v", s)
				}
			}},
		{name: "share defaults", args: []string{"list"}, cmd: "list", rest: []string{},
			check: func(t *testing.T, s Settings) {
				if s.SwarmMemoryResource != "VRAM" || s.SharedGPUs != nil {
					t.Errorf("memory resource %q, shared GPUs %q; want VRAM and every GPU (nil)", s.SwarmMemoryResource, s.SharedGPUs)
				}
			}},
		{name: "swarm slices", args: []string{"--swarm-slice-resource", "gpu-part", "--swarm-slices=8", "list"}, cmd: "list", rest: []string{},
			check: func(t *testing.T, s Settings) {
				if sw := s.swarm(); sw.Slice != "gpu-part" || sw.Slices != 8 || sw.sliceKey() != "DOCKER_RESOURCE_GPU-PART" || len(s.RuncArgs) != 0 {
					t.Errorf("settings %+v, swarm %+v", s, sw)
				}
			}},
		{name: "swarm slice defaults", args: []string{"list"}, cmd: "list", rest: []string{},
			check: func(t *testing.T, s Settings) {
				if sw := s.swarm(); sw.Slice != "NVIDIA-GPU-SLICE" || sw.Slices != 0 || sw.Memory != "VRAM" || !slices.Equal(sw.GPUs, defaultSwarmResources) {
					t.Errorf("swarm %+v; want NVIDIA-GPU-SLICE, its count not set", sw)
				}
			}},
		{name: "one slice per GPU", args: []string{"--swarm-slices", "1", "list"}, err: true},
		{name: "49 slices per GPU", args: []string{"--swarm-slices", "49", "list"}, err: true},
		{name: "slices not a number", args: []string{"--swarm-slices", "four", "list"}, err: true},
		{name: "slice resource is a GPU resource", args: []string{"--swarm-slice-resource", "nvidia-gpu", "list"}, err: true},
		{name: "slice resource is the memory resource", args: []string{"--swarm-memory-resource", "SLICE", "--swarm-slice-resource", "slice", "list"}, err: true},
		{name: "shared all", args: []string{"--shared-gpus=all", "list"}, cmd: "list", rest: []string{},
			check: func(t *testing.T, s Settings) {
				if s.SharedGPUs != nil {
					t.Errorf("shared GPUs %q, want every GPU (nil)", s.SharedGPUs)
				}
			}},
		{name: "shared none", args: []string{"--shared-gpus", "none", "list"}, cmd: "list", rest: []string{},
			check: func(t *testing.T, s Settings) {
				if s.SharedGPUs == nil || len(s.SharedGPUs) != 0 {
					t.Errorf("shared GPUs %#v, want none (empty)", s.SharedGPUs)
				}
			}},
		{name: "shared MIG device", args: []string{"--shared-gpus", "MIG-abc", "list"}, err: true},
		{name: "shared bad list", args: []string{"--shared-gpus", "1,,2", "list"}, err: true},
		{name: "shared void", args: []string{"--shared-gpus", "void", "list"}, err: true},
		{name: "memory resource is a GPU resource", args: []string{"--swarm-memory-resource", "GPU", "list"}, err: true},
		{name: "memory resource named as GPUs", args: []string{"--swarm-resource", "VRAM", "list"}, err: true},
		{name: "unknown policy", args: []string{"--accept-env-request=yes", "list"}, err: true},
		{name: "bad timeout", args: []string{"--timeout", "soon", "list"}, err: true},
		{name: "negative timeout", args: []string{"--timeout", "-1s", "list"}, err: true},
		{name: "missing value", args: []string{"--state-dir"}, err: true},
		{name: "empty own value", args: []string{"--runc=", "list"}, err: true},
		{name: "simulate without dev root", args: []string{"--simulate", "pcie8", "list"}, err: true},
		{name: "bad log format", args: []string{"--log-format", "xml", "list"}, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, cmd, rest, err := splitArgs(tc.args)
			if tc.err {
				if !errors.Is(err, ErrUsage) {
					t.Fatalf("splitArgs(%q): %v, want ErrUsage", tc.args, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cmd != tc.cmd || !slices.Equal(rest, tc.rest) || !slices.Equal(s.RuncArgs, tc.runcArgs) {
				t.Errorf("splitArgs(%q) = cmd %q rest %q runc %q; want %q %q %q", tc.args, cmd, rest, s.RuncArgs, tc.cmd, tc.rest, tc.runcArgs)
			}
			if tc.check != nil {
				tc.check(t, s)
			}
		})
	}
}

func TestParseCreate(t *testing.T) {
	for _, tc := range []struct {
		name string
		rest []string
		want CreateArgs
		err  bool
	}{
		{name: "containerd's", rest: []string{"--bundle", "/b", "--pid-file", "/p", "--console-socket", "/s", "id1"}, want: CreateArgs{ID: "id1", Bundle: "/b"}},
		{name: "podman's", rest: []string{"-b=/b", "--no-new-keyring", "--preserve-fds", "2", "id2"}, want: CreateArgs{ID: "id2", Bundle: "/b", PreserveFDs: 2}},
		{name: "default bundle", rest: []string{"id3"}, want: CreateArgs{ID: "id3", Bundle: "."}},
		{name: "no id", rest: []string{"--bundle", "/b"}, err: true},
		{name: "two ids", rest: []string{"a", "b"}, err: true},
		{name: "bad preserve-fds", rest: []string{"--preserve-fds", "x", "id"}, err: true},
		{name: "missing value", rest: []string{"id", "--pid-file"}, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCreate(tc.rest)
			if tc.err {
				if !errors.Is(err, ErrUsage) {
					t.Fatalf("parseCreate(%q) = %+v, %v; want ErrUsage", tc.rest, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("parseCreate(%q) = %+v, %v; want %+v", tc.rest, got, err, tc.want)
			}
		})
	}
}
