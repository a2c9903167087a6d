package cli

import (
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// IsRoot reports whether the program runs as root (effective user id 0).
func IsRoot() bool { return linux.IsRoot() }

// NeedsRoot writes prog's one line for a run without root that needs it,
// saying for what (why) and what to do (remedy; "run it as root" when
// empty), and returns ExitError:
//
//	gpurun: needs root (to make its containers' cgroups and device nodes): run it as root
func NeedsRoot(stderr io.Writer, prog, why, remedy string) int {
	if remedy == "" {
		remedy = "run it as root"
	}
	fmt.Fprintf(stderr, "%s: needs root (%s): %s\n", prog, why, remedy)
	return ExitError
}

// SizeUnit refuses a size flag's value that is a bare number: sizes take a
// unit (4GiB, 512MiB, 4096M; B for bytes), so that 4096 meant as MiB is
// never taken as 4096 bytes. The error names the flag and the units, for
// a usage line.
func SizeUnit(flag, value string) error {
	v := strings.TrimSpace(value)
	if v == "" || strings.Trim(v, "0123456789") != "" {
		return nil // has a unit, or is not a number: the parser says what is wrong
	}
	example := v + "MiB"
	if n, err := strconv.ParseUint(v, 10, 64); err == nil && n >= 1024 && n%1024 == 0 {
		example += fmt.Sprintf(" or %dGiB", n/1024)
	}
	return fmt.Errorf("--%s %s: a size needs a unit, such as %s (K, M, G, T are binary; B for bytes)", flag, value, example)
}

// numaNodes finds the NUMA node numbers an error names.
var numaNodes = regexp.MustCompile(`NUMA nodes? ([0-9][0-9,-]*)`)

// ExplainNUMA turns the refusal of --cpu-affinity numa on a host that
// lacks its GPUs' NUMA nodes (err, matching isolator.ErrUnknownNUMANode)
// into the operator's words, ending with what to do.
func ExplainNUMA(err error) string {
	nodes := "a NUMA node"
	if m := numaNodes.FindStringSubmatch(err.Error()); m != nil {
		nodes = "NUMA node " + m[1]
	}
	return fmt.Sprintf("--cpu-affinity numa: the GPUs are on %s, which this host does not have (a simulated node's topology is not the host's): run with --cpu-affinity none", nodes)
}
