package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// TestSizeUnit: a bare number is refused naming the flag and a unit to
// write; a size with a unit, or something not a number, is left to the
// size parser.
func TestSizeUnit(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  string // "" when accepted
	}{
		{"4096", "--gpu-memory 4096: a size needs a unit, such as 4096MiB or 4GiB"},
		{"512", "--gpu-memory 512: a size needs a unit, such as 512MiB ("},
		{" 100 ", "a size needs a unit"},
		{"4GiB", ""}, {"512M", ""}, {"4096B", ""}, {"4 G", ""}, {"", ""}, {"lots", ""},
	} {
		err := SizeUnit("gpu-memory", tc.value)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("SizeUnit(%q) = %v, want nil", tc.value, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("SizeUnit(%q) = %v, want %q", tc.value, err, tc.want)
		}
	}
}

// TestNeedsRoot: one line, the program's name first, what it needs root
// for, ending with what to do; ExitError.
func TestNeedsRoot(t *testing.T) {
	var b bytes.Buffer
	if code := NeedsRoot(&b, "gpuinfo", "to make device nodes", ""); code != ExitError {
		t.Errorf("exit %d, want %d", code, ExitError)
	}
	if got, want := b.String(), "gpuinfo: needs root (to make device nodes): run it as root\n"; got != want {
		t.Errorf("NeedsRoot wrote %q, want %q", got, want)
	}
}

// TestExplainNUMA: the refusal names the NUMA node and the flag, once,
// and ends with what to do.
func TestExplainNUMA(t *testing.T) {
	err := errors.New("launch gpurun-1: plan for gpurun-1: CPU affinity: NUMA node 1: NUMA node not on this host: open /sys/devices/system/node/node1/cpulist: no such file or directory")
	got := ExplainNUMA(err)
	if !strings.HasPrefix(got, "--cpu-affinity numa: the GPUs are on NUMA node 1,") || !strings.HasSuffix(got, "run with --cpu-affinity none") ||
		strings.Count(got, "NUMA node") != 1 {
		t.Errorf("ExplainNUMA = %q", got)
	}
}
