package testenv

import "testing"

func TestRequired(t *testing.T) {
	tests := []struct {
		name  string
		env   string
		suite Suite
		want  bool
	}{
		{"unset", "", Root, false},
		{"listed", "docker,root", Root, true},
		{"spaces", " docker , cgroup2 ", CgroupV2, true},
		{"not listed", "docker", CgroupV1Devices, false},
		{"all", "all", NVIDIALibraries, true},
		{"all holds podman", "all", Podman, true},
		{"all holds kubernetes", "all", Kubernetes, true},
		{"all leaves hardware out", "all", GPU, false},
		{"hardware by name", "all,gpu", GPU, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(RequireEnv, tt.env)
			if got := Required(tt.suite); got != tt.want {
				t.Fatalf("Required(%q) with %s=%q = %v, want %v", tt.suite, RequireEnv, tt.env, got, tt.want)
			}
		})
	}
}
