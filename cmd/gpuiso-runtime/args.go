package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// ErrUsage: the command line does not parse.
var ErrUsage = node.Sentinel(node.ErrInvalid, "bad command line")

// Settings are gpuiso-runtime's own global flags, and runc's, which it
// passes on.
type Settings struct {
	// Runc is the runtime handed over to (--runc, default "runc" on PATH).
	Runc string
	// StateDir holds the allocator's state (--state-dir): GPUs are then
	// owned by the containers that name them. "" only isolates.
	StateDir string
	// Simulate names a simulated node (--simulate) whose host tree lives
	// under DevRoot (--sim-root), made on first use and kept, only in a
	// directory that root owns, as every parent, and no one else may
	// write in. --dev-root is --sim-root's old spelling, still read: the
	// other programs' --dev-root (gpuinfo's) is a directory of device nodes.
	Simulate, DevRoot string
	// Log is the log file (--log), shared with runc, in LogFormat
	// (--log-format: text or json, as runc writes it).
	Log, LogFormat string
	// CDIKind is the CDI kind whose annotations name GPUs (--cdi-kind).
	CDIKind string
	// SwarmResources are the Swarm generic resource names read as GPUs
	// (--swarm-resource, repeatable).
	SwarmResources []string
	// SwarmMemoryResource is the Swarm generic resource read as a memory
	// share of one GPU, in MiB (--swarm-memory-resource, default VRAM).
	SwarmMemoryResource string
	// SwarmSliceResource is the Swarm generic resource read as a
	// concurrent slice of one GPU (--swarm-slice-resource, default
	// NVIDIA-GPU-SLICE): a named resource, one id "<GPU>::<k>" per slice.
	SwarmSliceResource string
	// SwarmSlices is the count of concurrent slices each GPU is split in
	// for SwarmSliceResource (--swarm-slices, 2 to 48; 0: not set, and a
	// slice Swarm assigned is refused).
	SwarmSlices int
	// SharedGPUs are the GPUs that take shares (--shared-gpus: indexes or
	// UUIDs); nil means every GPU without MIG, empty none.
	SharedGPUs []string
	// AcceptEnv says when NVIDIA_VISIBLE_DEVICES in the spec is a request
	// (--accept-env-request, default "caller").
	AcceptEnv AcceptEnv
	// AcceptCDIAnnotations lets the CDI annotations of a container Podman
	// did not create ask for GPUs (--accept-cdi-annotations, default
	// false).
	AcceptCDIAnnotations bool
	// Timeout bounds create's own work before runc (reading the image,
	// waiting for the state directory's lock) (--timeout, default 30s).
	Timeout time.Duration
	// RuncArgs are runc's global flags, in order, as given.
	RuncArgs []string
}

// Flags of gpuiso-runtime itself (with a value each).
var ownFlags = []string{"runc", "state-dir", "simulate", "sim-root", "dev-root", "cdi-kind", "swarm-resource", "swarm-memory-resource", "swarm-slice-resource", "swarm-slices", "shared-gpus", "accept-env-request", "accept-cdi-annotations", "timeout"}

// defaultTimeout is create's deadline without --timeout.
const defaultTimeout = 30 * time.Second

// Global flags of runc that take a value; log and log-format are also read
// by gpuiso-runtime.
var runcValueFlags = []string{"root", "log", "log-format", "criu", "rootless"}

// splitArgs reads the global flags before the OCI subcommand (both "-f" and
// "--f", with "=value" or the next argument as value) and returns the
// settings, the subcommand ("" when there is none, as for --version) and
// the subcommand's arguments. Flags it does not know are runc's booleans
// and are passed on.
func splitArgs(args []string) (s Settings, cmd string, rest []string, err error) {
	s = Settings{Runc: "runc", LogFormat: "text", CDIKind: "nvidia.com/gpu", AcceptEnv: AcceptCaller, Timeout: defaultTimeout,
		SwarmMemoryResource: defaultSwarmMemoryResource, SwarmSliceResource: defaultSwarmSliceResource}
	var swarm []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || !strings.HasPrefix(a, "-") || a == "-" {
			if a == "--" {
				i++
			}
			if i < len(args) {
				cmd, rest = args[i], slices.Clone(args[i+1:])
			}
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		own := slices.Contains(ownFlags, name)
		if !own && !slices.Contains(runcValueFlags, name) {
			s.RuncArgs = append(s.RuncArgs, a) // a boolean of runc's
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				return Settings{}, "", nil, fmt.Errorf("flag %s needs a value: %w", a, ErrUsage)
			}
			i++
			value = args[i]
		}
		if !own {
			s.RuncArgs = append(s.RuncArgs, "--"+name, value)
		}
		switch name {
		case "runc":
			s.Runc = value
		case "state-dir":
			s.StateDir = value
		case "simulate":
			s.Simulate = value
		case "sim-root", "dev-root":
			if s.DevRoot != "" {
				return Settings{}, "", nil, fmt.Errorf("--sim-root given twice (--dev-root is its old spelling): give it once: %w", ErrUsage)
			}
			s.DevRoot = value
		case "cdi-kind":
			s.CDIKind = value
		case "swarm-resource":
			swarm = append(swarm, value)
		case "swarm-memory-resource":
			s.SwarmMemoryResource = value
		case "swarm-slice-resource":
			s.SwarmSliceResource = value
		case "swarm-slices":
			n, err := strconv.Atoi(value)
			if err != nil || n < allocator.MinSlices || n > allocator.MaxSlices {
				return Settings{}, "", nil, fmt.Errorf("--swarm-slices %q: want a count of slices per GPU from %d to %d: %w", value, allocator.MinSlices, allocator.MaxSlices, ErrUsage)
			}
			s.SwarmSlices = n
		case "shared-gpus":
			if s.SharedGPUs, err = parseSharedGPUs(value); err != nil {
				return Settings{}, "", nil, err
			}
		case "accept-env-request":
			s.AcceptEnv = AcceptEnv(value)
			if !slices.Contains(acceptEnvValues, s.AcceptEnv) {
				return Settings{}, "", nil, fmt.Errorf("--accept-env-request %q: want never, caller, privileged or always: %w", value, ErrUsage)
			}
		case "accept-cdi-annotations":
			b, err := strconv.ParseBool(value)
			if err != nil {
				return Settings{}, "", nil, fmt.Errorf("--accept-cdi-annotations %q: want true or false: %w", value, ErrUsage)
			}
			s.AcceptCDIAnnotations = b
		case "timeout":
			d, err := time.ParseDuration(value)
			if err != nil || d <= 0 {
				return Settings{}, "", nil, fmt.Errorf("--timeout %q: want a positive duration such as 30s: %w", value, ErrUsage)
			}
			s.Timeout = d
		case "log":
			s.Log = value
		case "log-format":
			s.LogFormat = value
		}
		if own && value == "" {
			return Settings{}, "", nil, fmt.Errorf("flag --%s: empty value: %w", name, ErrUsage)
		}
	}
	s.SwarmResources = defaultSwarmResources
	if len(swarm) > 0 {
		s.SwarmResources = swarm
	}
	if slices.Contains(s.SwarmResources, s.SwarmMemoryResource) {
		return Settings{}, "", nil, fmt.Errorf("--swarm-memory-resource %q is also a GPU resource (--swarm-resource): %w", s.SwarmMemoryResource, ErrUsage)
	}
	// Swarm upper-cases a resource's name in the task's environment.
	slice := strings.ToUpper(s.SwarmSliceResource)
	if slices.ContainsFunc(s.SwarmResources, func(n string) bool { return strings.ToUpper(n) == slice }) || strings.ToUpper(s.SwarmMemoryResource) == slice {
		return Settings{}, "", nil, fmt.Errorf("--swarm-slice-resource %q is also a GPU or memory resource (--swarm-resource, --swarm-memory-resource): %w", s.SwarmSliceResource, ErrUsage)
	}
	if s.LogFormat != "text" && s.LogFormat != "json" {
		return Settings{}, "", nil, fmt.Errorf("--log-format %q: want text or json: %w", s.LogFormat, ErrUsage)
	}
	if (s.Simulate == "") != (s.DevRoot == "") {
		return Settings{}, "", nil, fmt.Errorf("--simulate and --sim-root (or its old spelling --dev-root) go together: give both or neither: %w", ErrUsage)
	}
	return s, cmd, rest, nil
}

// parseSharedGPUs reads --shared-gpus: "all" (every GPU without MIG, as
// nil), "none" (no GPU takes shares), or GPU indexes and GPU- UUIDs,
// comma-separated, each once.
func parseSharedGPUs(v string) ([]string, error) {
	switch strings.TrimSpace(v) {
	case "all":
		return nil, nil
	case "none":
		return []string{}, nil
	}
	d, err := ParseDevices(v)
	if err == nil && (d.None() || d.All) {
		err = fmt.Errorf("no GPU named: %w", ErrInvalidDevices)
	}
	for _, id := range d.IDs {
		if strings.HasPrefix(id, "MIG-") {
			err = fmt.Errorf("MIG device %s: MIG devices are not shared: %w", id, ErrInvalidDevices)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("--shared-gpus %q: want all, none or GPU indexes and UUIDs: %w: %w", v, ErrUsage, err)
	}
	return d.IDs, nil
}

// swarm returns the Swarm generic resources s reads.
func (s Settings) swarm() swarmNames {
	return swarmNames{GPUs: s.SwarmResources, Memory: s.SwarmMemoryResource, Slice: s.SwarmSliceResource, Slices: s.SwarmSlices}
}

// runcArgv is the command line that hands cmd and its arguments to runc:
// runc's own global flags, then the subcommand as given.
func (s Settings) runcArgv(cmd string, rest []string) []string {
	argv := append([]string{s.Runc}, s.RuncArgs...)
	if cmd != "" {
		argv = append(argv, cmd)
	}
	return append(argv, rest...)
}

// Create's flags that take a value (runc create and runc run).
var createValueFlags = []string{"bundle", "b", "console-socket", "pid-file", "preserve-fds"}

// CreateArgs are what gpuiso-runtime reads of "create" or "run".
type CreateArgs struct {
	ID, Bundle  string
	PreserveFDs int
}

// parseCreate reads the container id, bundle (default ".") and
// --preserve-fds of create's or run's arguments.
func parseCreate(rest []string) (CreateArgs, error) {
	c := CreateArgs{Bundle: "."}
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if !strings.HasPrefix(a, "-") || a == "-" {
			if c.ID != "" {
				return CreateArgs{}, fmt.Errorf("create: arguments %q after the container id: %w", rest[i:], ErrUsage)
			}
			c.ID = a
			continue
		}
		if a == "--" {
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !slices.Contains(createValueFlags, name) {
			continue
		}
		if !hasValue {
			if i+1 >= len(rest) {
				return CreateArgs{}, fmt.Errorf("create: flag %s needs a value: %w", a, ErrUsage)
			}
			i++
			value = rest[i]
		}
		switch name {
		case "bundle", "b":
			c.Bundle = value
		case "preserve-fds":
			n := 0
			if _, err := fmt.Sscanf(value, "%d", &n); err != nil || n < 0 || fmt.Sprint(n) != value {
				return CreateArgs{}, fmt.Errorf("create: --preserve-fds %q: %w", value, ErrUsage)
			}
			c.PreserveFDs = n
		}
	}
	if c.ID == "" {
		return CreateArgs{}, fmt.Errorf("create: no container id: %w", ErrUsage)
	}
	return c, nil
}

// deleteID returns the container id of delete's arguments.
func deleteID(rest []string) string {
	for _, a := range rest {
		if !strings.HasPrefix(a, "-") {
			return a
		}
	}
	return ""
}
