package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/volume"
)

// ErrInvalidDevices: a device list (NVIDIA_VISIBLE_DEVICES, a Swarm
// resource, a CDI annotation) does not parse.
var ErrInvalidDevices = node.Sentinel(node.ErrInvalid, "invalid device list")

// Where a container's request comes from.
const (
	envVisibleDevices = volume.EnvVisibleDevices
	// envSwarmPrefix prefixes the generic resources Docker Swarm assigned a
	// task: DOCKER_RESOURCE_<NAME>=<id>[,<id>...].
	envSwarmPrefix = "DOCKER_RESOURCE_"
	// annotationCDIPrefix prefixes the CDI device annotations of a spec
	// (cdi.k8s.io/<key>=<vendor/class=name>[,...]).
	annotationCDIPrefix = "cdi.k8s.io/"
)

// defaultSwarmResources are the generic resource names read as GPUs.
var defaultSwarmResources = []string{"NVIDIA-GPU", "NVIDIA_GPU", "GPU"}

// Devices is a parsed device list: every GPU, or the named ones.
type Devices struct {
	// All asks for every GPU of the node.
	All bool
	// IDs are GPU indexes, GPU- UUIDs or MIG- UUIDs, in the order given.
	IDs []string
}

// None reports whether d asks for no GPU.
func (d Devices) None() bool { return !d.All && len(d.IDs) == 0 }

// ParseDevices parses a device list as NVIDIA_VISIBLE_DEVICES holds it:
// "all"; "", "none" or "void" (no GPU); or comma-separated GPU indexes,
// GPU- UUIDs and MIG- UUIDs, each once. The MIG "GPU:instance" form is
// refused: a MIG device is named by its UUID.
func ParseDevices(s string) (Devices, error) {
	s = strings.TrimSpace(s)
	switch s {
	case "", "none", "void":
		return Devices{}, nil
	case "all":
		return Devices{All: true}, nil
	}
	var d Devices
	for _, id := range strings.Split(s, ",") {
		id = strings.TrimSpace(id)
		if err := validID(id); err != nil {
			return Devices{}, fmt.Errorf("device list %q: %w", s, err)
		}
		if slices.Contains(d.IDs, id) {
			return Devices{}, fmt.Errorf("device list %q: %q named twice: %w", s, id, ErrInvalidDevices)
		}
		d.IDs = append(d.IDs, id)
	}
	return d, nil
}

// validID checks one entry of a device list.
func validID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("empty entry: %w", ErrInvalidDevices)
	case id == "all" || id == "none" || id == "void":
		return fmt.Errorf("%q among other entries: %w", id, ErrInvalidDevices)
	case strings.Trim(id, "0123456789") == "":
		n, err := strconv.Atoi(id)
		if err != nil || n >= allocator.MaxDevices {
			return fmt.Errorf("index %s out of range: %w", id, ErrInvalidDevices)
		}
		return nil
	case strings.Contains(id, ":") && strings.Trim(id, "0123456789:") == "":
		return fmt.Errorf("MIG device %q: name it by its MIG- UUID: %w", id, ErrInvalidDevices)
	case strings.HasPrefix(id, "GPU-") || strings.HasPrefix(id, "MIG-"):
		if len(id) == 4 || len(id) > 128 {
			return fmt.Errorf("UUID %q: %w", id, ErrInvalidDevices)
		}
		for _, c := range id {
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '/') {
				return fmt.Errorf("UUID %q holds %q: %w", id, c, ErrInvalidDevices)
			}
		}
		return nil
	}
	return fmt.Errorf("%q is no index, GPU- or MIG- UUID: %w", id, ErrInvalidDevices)
}

// Request is what a container's spec asks of gpuiso.
type Request struct {
	Devices
	// Source names where the devices came from ("NVIDIA_VISIBLE_DEVICES",
	// "DOCKER_RESOURCE_NVIDIA-GPU", "cdi.k8s.io/..."), "" for none.
	Source string
}

// requestOf reads what spec asks for, first found wins: the GPUs Docker
// Swarm assigned (DOCKER_RESOURCE_<NAME> for each name of swarm), the CDI
// annotations naming devices of kind, then NVIDIA_VISIBLE_DEVICES (its last
// setting). Swarm comes first because CUDA images set
// NVIDIA_VISIBLE_DEVICES=all in their environment.
func requestOf(spec *specs.Spec, kind string, swarm []string) (Request, error) {
	var env []string
	if spec.Process != nil {
		env = spec.Process.Env
	}
	img := volume.Image{Env: env}
	var swarmIDs []string
	var swarmSources []string
	for _, name := range swarm {
		v, ok := img.Getenv(envSwarmPrefix + name)
		if !ok {
			continue
		}
		d, err := ParseDevices(v)
		if err != nil {
			return Request{}, fmt.Errorf("%s%s: %w", envSwarmPrefix, name, err)
		}
		if d.All {
			return Request{}, fmt.Errorf("%s%s: \"all\" is no Swarm assignment: %w", envSwarmPrefix, name, ErrInvalidDevices)
		}
		swarmIDs = append(swarmIDs, d.IDs...)
		swarmSources = append(swarmSources, envSwarmPrefix+name)
	}
	if len(swarmSources) > 0 {
		d, err := ParseDevices(strings.Join(swarmIDs, ","))
		if err != nil {
			return Request{}, fmt.Errorf("%s: %w", strings.Join(swarmSources, ", "), err)
		}
		return Request{Devices: d, Source: strings.Join(swarmSources, ", ")}, nil
	}
	if r, err := cdiRequest(spec.Annotations, kind); err != nil || r.Source != "" {
		return r, err
	}
	if v, ok := img.Getenv(envVisibleDevices); ok {
		d, err := ParseDevices(v)
		if err != nil {
			return Request{}, fmt.Errorf("%s: %w", envVisibleDevices, err)
		}
		return Request{Devices: d, Source: envVisibleDevices}, nil
	}
	return Request{}, nil
}

// cdiRequest reads the CDI annotations of a spec: the devices of kind they
// name ("<kind>=<index|UUID|all>"). Devices of other kinds are left to the
// runtime that reads the annotations.
func cdiRequest(annotations map[string]string, kind string) (Request, error) {
	var keys []string
	for k := range annotations {
		if strings.HasPrefix(k, annotationCDIPrefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var ids, sources []string
	for _, k := range keys {
		for _, name := range strings.Split(annotations[k], ",") {
			vendor, class, dev, err := parser.ParseQualifiedName(strings.TrimSpace(name))
			if err != nil {
				return Request{}, fmt.Errorf("annotation %s: %w: %v", k, ErrInvalidDevices, err)
			}
			if vendor+"/"+class != kind {
				continue
			}
			ids = append(ids, dev)
			if !slices.Contains(sources, k) {
				sources = append(sources, k)
			}
		}
	}
	if len(sources) == 0 {
		return Request{}, nil
	}
	d, err := ParseDevices(strings.Join(ids, ","))
	if err != nil {
		return Request{}, fmt.Errorf("%s: %w", strings.Join(sources, ", "), err)
	}
	return Request{Devices: d, Source: strings.Join(sources, ", ")}, nil
}

// allocation turns d into an allocator request on inv: every GPU of the
// node (by UUID) for All, else the named devices.
func (d Devices) allocation(inv *node.Inventory) allocator.Request {
	if !d.All {
		return allocator.Request{Devices: slices.Clone(d.IDs)}
	}
	var r allocator.Request
	for _, g := range inv.Devices {
		r.Devices = append(r.Devices, g.UUID)
	}
	return r
}
