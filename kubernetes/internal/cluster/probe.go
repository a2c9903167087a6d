package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// ProbePackage is the program test pods run (gpuiso's test probe); it is
// also the sandbox image's program, run with PauseArgs.
const ProbePackage = "github.com/gpuiso/gpuiso/testdata/probe"

// ProbeEnv names a prebuilt static probe to use instead of building one.
const ProbeEnv = "GPUISO_PROBE"

// PauseArgs make the probe wait until it is killed: a sandbox's pause
// program.
var PauseArgs = []string{"sleep", "2000000000"}

// BuildProbe returns a static probe binary: the one ProbeEnv names, else
// one built with the go command into dir.
func BuildProbe(ctx context.Context, dir string) (string, error) {
	if p := os.Getenv(ProbeEnv); p != "" {
		return p, executable(p)
	}
	out := filepath.Join(dir, "probe")
	cmd := exec.CommandContext(ctx, "go", "build", "-buildvcs=false", "-trimpath", "-o", out, ProbePackage)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the probe: %w\n%s", err, b)
	}
	return out, nil
}
