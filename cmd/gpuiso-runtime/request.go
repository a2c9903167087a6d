package main

import (
	"context"
	"fmt"
	"path/filepath"
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

// ErrInvalidShare: a request for a share of a GPU (a Swarm memory or
// slice resource, GPUISO_GPU_MEMORY, GPUISO_GPU_COMPUTE, GPUISO_GPU_SLICES,
// GPUISO_GPU_TIME_SLICE) does not parse, asks for two kinds of share or
// more than one slice, or names more than one GPU.
var ErrInvalidShare = node.Sentinel(node.ErrInvalid, "invalid GPU share request")

// Where a container's request comes from.
const (
	envVisibleDevices = volume.EnvVisibleDevices
	// envSwarmPrefix prefixes the generic resources Docker Swarm assigned a
	// task: DOCKER_RESOURCE_<NAME>=<id>[,<id>...].
	envSwarmPrefix = "DOCKER_RESOURCE_"
	// annotationCDIPrefix prefixes the CDI device annotations of a spec
	// (cdi.k8s.io/<key>=<vendor/class=name>[,...]).
	annotationCDIPrefix = "cdi.k8s.io/"
	// envGPUMemory asks for a memory share of one GPU (4GiB, 8000M; as
	// gpurun --gpu-memory), envGPUCompute for a percentage of its compute
	// beside it (1 to 100): the caller's explicit request for a share.
	envGPUMemory  = "GPUISO_GPU_MEMORY"
	envGPUCompute = "GPUISO_GPU_COMPUTE"
	// envGPUSlices asks for a concurrent slice, one of N of a GPU (2 to
	// 48; as gpurun --gpu-slices), envGPUTimeSlice for a time slice (1 or
	// true; as gpurun --gpu-time-slice): the caller's explicit requests
	// for the other kinds of share.
	envGPUSlices    = "GPUISO_GPU_SLICES"
	envGPUTimeSlice = "GPUISO_GPU_TIME_SLICE"
	// defaultSwarmMemoryResource is the generic resource read as a memory
	// share, in MiB (--swarm-memory-resource).
	defaultSwarmMemoryResource = "VRAM"
	// maxShareMiB bounds a Swarm memory resource's amount (16 TiB).
	maxShareMiB = 1 << 24
	// defaultSwarmSliceResource is the generic resource read as a
	// concurrent slice (--swarm-slice-resource): a named resource whose
	// ids are "<GPU>::<k>", sliceIDSep between the GPU (an index or a
	// GPU- UUID) and the slice's number k, 0 to --swarm-slices minus one.
	defaultSwarmSliceResource = "NVIDIA-GPU-SLICE"
	sliceIDSep                = "::"
)

// swarmNames are the Swarm generic resources a spec's DOCKER_RESOURCE_*
// are read as.
type swarmNames struct {
	// GPUs name whole GPUs (--swarm-resource).
	GPUs []string
	// Memory names a memory share in MiB (--swarm-memory-resource), ""
	// for none.
	Memory string
	// Slice names a concurrent slice, one id "<GPU>::<k>" a slice
	// (--swarm-slice-resource), "" for none; Slices is the count each
	// GPU is split in (--swarm-slices), 0 when not set.
	Slice  string
	Slices int
}

// sliceKey is the variable Swarm sets for the slice resource: Swarm
// upper-cases a resource's name there.
func (sw swarmNames) sliceKey() string { return swarmKey(sw.Slice) }

// swarmKey is the variable Swarm sets for the generic resource name:
// DOCKER_RESOURCE_ and the name upper-cased, as Swarm writes it.
func swarmKey(name string) string { return envSwarmPrefix + strings.ToUpper(name) }

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
	seen := map[string]struct{}{}
	for id := range strings.SplitSeq(s, ",") {
		id = strings.TrimSpace(id)
		if err := validID(id); err != nil {
			return Devices{}, fmt.Errorf("device list %s: %w", quoteShort(s), err)
		}
		if _, dup := seen[id]; dup {
			return Devices{}, fmt.Errorf("device list %s: %q named twice: %w", quoteShort(s), id, ErrInvalidDevices)
		}
		seen[id] = struct{}{}
		d.IDs = append(d.IDs, id)
	}
	return d, nil
}

// quoteShort quotes a device list for an error, cut to its first 200
// bytes: an error is one line, whatever the list's length.
func quoteShort(s string) string {
	const max = 200
	if len(s) <= max {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:max]) + fmt.Sprintf("... (%d bytes)", len(s))
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
	// Share is the memory share of one GPU asked for (a Swarm memory
	// resource, GPUISO_GPU_MEMORY), or nil; Devices then name that GPU,
	// or none (the allocator's choice). ShareSource names where it came
	// from.
	Share       *allocator.Share
	ShareSource string
	// Volume says the caller asked for the driver volume without GPUs
	// (NVIDIA_VISIBLE_DEVICES=none, or the com.nvidia.volumes.needed
	// annotation).
	Volume bool
	// Ignored says what of the spec looked like a request and is not one,
	// and why, for the log.
	Ignored []string
}

// AcceptEnv says when the spec's NVIDIA_VISIBLE_DEVICES is a request
// (--accept-env-request).
type AcceptEnv string

// The values of --accept-env-request, from the strictest.
const (
	// AcceptNever: the environment never asks for GPUs; only CDI
	// annotations and Swarm's assignments do.
	AcceptNever AcceptEnv = "never"
	// AcceptCaller (the default): NVIDIA_VISIBLE_DEVICES asks only where
	// the engine's record of the image shows that the caller set it: the
	// image's own configuration does not hold that value.
	AcceptCaller AcceptEnv = "caller"
	// AcceptPrivileged: as AcceptCaller, and a privileged container's
	// (CAP_SYS_ADMIN in its bounding set) environment always asks.
	AcceptPrivileged AcceptEnv = "privileged"
	// AcceptAlways: the whole environment is the caller's, the image's own
	// settings and DOCKER_RESOURCE_* included: for engines whose images
	// the operator controls.
	AcceptAlways AcceptEnv = "always"
)

// acceptEnvValues are the values --accept-env-request takes.
var acceptEnvValues = []AcceptEnv{AcceptNever, AcceptCaller, AcceptPrivileged, AcceptAlways}

// trust decides which of a spec's settings its caller made.
type trust struct {
	// Policy is --accept-env-request.
	Policy AcceptEnv
	// CDIAnnotations is --accept-cdi-annotations: the CDI annotations of
	// a spec Podman did not write may ask.
	CDIAnnotations bool
	// Load finds the engine's record of the container's image; it is
	// called at most once, and only when the spec has something to check.
	Load func() (*engineRecord, error)

	loaded bool
	rec    *engineRecord
	why    string
}

// record returns the engine's record of the image, nil when there is none
// (t.why says why).
func (t *trust) record() *engineRecord {
	if !t.loaded {
		t.loaded = true
		if t.Load == nil {
			t.why = "no engine record"
			return nil
		}
		var err error
		if t.rec, err = t.Load(); err != nil {
			t.rec, t.why = nil, err.Error()
		}
	}
	return t.rec
}

// podmanAnnotation is set by Podman on every spec it writes.
const podmanAnnotation = "io.container.manager"

// annotation reports whether annotation k=v of spec is the caller's: not
// one Podman copied from the image's manifest. A CDI annotation asks only
// in a container Podman created (its record read), unless the operator
// lets the others ask (--accept-cdi-annotations): elsewhere whoever may
// annotate a container (a Kubernetes pod's author, through a CRI that
// passes pod annotations on) is not shown apart from the caller. Without
// Podman's record of the image, a Podman spec's annotations cannot be told
// apart and count as the image's, unless the policy is "always"; Docker
// and containerd copy no image annotations.
func (t *trust) annotation(spec *specs.Spec, k, v string) (bool, string) {
	if strings.HasPrefix(k, annotationCDIPrefix) && !t.CDIAnnotations {
		rec := t.record()
		if rec == nil && spec.Annotations[podmanAnnotation] == "libpod" {
			return false, "Podman copies image annotations and its record of the image is not readable (" + t.why + ")"
		}
		if rec == nil || rec.Engine != "podman" {
			return false, "a CDI annotation of a container Podman did not create (--accept-cdi-annotations is false)"
		}
	}
	if t.Policy == AcceptAlways {
		return true, ""
	}
	if rec := t.record(); rec != nil {
		if iv, ok := rec.ImageAnnotations[k]; ok && iv == v {
			return false, "the image's own annotation"
		}
		return true, ""
	}
	if spec.Annotations[podmanAnnotation] == "libpod" {
		return false, "Podman copies image annotations and its record of the image is not readable (" + t.why + ")"
	}
	return true, ""
}

// env reports whether key=v of spec's environment (NVIDIA_VISIBLE_DEVICES,
// GPUISO_GPU_MEMORY, GPUISO_GPU_COMPUTE, GPUISO_GPU_SLICES,
// GPUISO_GPU_TIME_SLICE) asks, and why not.
func (t *trust) env(spec *specs.Spec, key, v string) (bool, string) {
	switch t.Policy {
	case AcceptAlways:
		return true, ""
	case AcceptNever:
		return false, "--accept-env-request=never"
	case AcceptPrivileged:
		if privileged(spec) {
			return true, ""
		}
	}
	rec := t.record()
	switch {
	case rec == nil:
		return false, "no record of the image tells the caller's setting from the image's (" + t.why + ")"
	}
	if why := rec.fromImage(key, v); why != "" {
		return false, why
	}
	return true, ""
}

// swarm reports whether DOCKER_RESOURCE_<name>=v of spec is what Docker
// Swarm assigned the task: the container is a Swarm task in Docker's
// record, and the value is not the image's own.
func (t *trust) swarm(key, v string) (bool, string) {
	if t.Policy == AcceptAlways {
		return true, ""
	}
	rec := t.record()
	switch {
	case rec == nil:
		return false, "no Docker record shows a Swarm task (" + t.why + ")"
	case !rec.swarmTask():
		return false, "not a Docker Swarm task"
	}
	if why := rec.fromImage(key, v); why != "" {
		return false, why
	}
	return true, ""
}

// privileged reports whether spec's process may do anything (CAP_SYS_ADMIN
// in its bounding set): an image cannot make itself so.
func privileged(spec *specs.Spec) bool {
	return spec.Process != nil && spec.Process.Capabilities != nil && slices.Contains(spec.Process.Capabilities.Bounding, "CAP_SYS_ADMIN")
}

// requestOf reads what spec asks for, first found wins: the slice Docker
// Swarm assigned (DOCKER_RESOURCE_<swarm.Slice>, whose id names its GPU),
// the GPUs Swarm assigned (DOCKER_RESOURCE_<NAME> for each name of
// swarm.GPUs), the CDI annotations naming devices of kind, then
// NVIDIA_VISIBLE_DEVICES (its last setting). A memory share is asked for
// by Swarm's memory resource (DOCKER_RESOURCE_<swarm.Memory>, MiB), else
// GPUISO_GPU_MEMORY, with GPUISO_GPU_COMPUTE beside either; a concurrent
// slice by Swarm's slice resource or GPUISO_GPU_SLICES, a time slice by
// GPUISO_GPU_TIME_SLICE (see shareOf). Only what the caller set counts
// (see trust); the rest is listed in Ignored.
func requestOf(spec *specs.Spec, kind string, swarm swarmNames, t *trust) (Request, error) {
	var env []string
	if spec.Process != nil {
		env = spec.Process.Env
	}
	img := volume.Image{Env: env}
	var ignored []string
	var swarmIDs []string
	var swarmSources []string
	for _, name := range swarm.GPUs {
		key := swarmKey(name)
		v, ok := img.Getenv(key)
		if !ok {
			continue
		}
		if ok, why := t.swarm(key, v); !ok {
			ignored = append(ignored, fmt.Sprintf("%s: %s", key, why))
			continue
		}
		d, err := ParseDevices(v)
		if err != nil {
			return Request{}, fmt.Errorf("%s: %w", key, err)
		}
		if d.All {
			return Request{}, fmt.Errorf("%s: \"all\" is no Swarm assignment: %w", key, ErrInvalidDevices)
		}
		swarmIDs = append(swarmIDs, d.IDs...)
		swarmSources = append(swarmSources, key)
	}
	annotations := map[string]string{}
	for k, v := range spec.Annotations {
		if !strings.HasPrefix(k, annotationCDIPrefix) && k != volume.LabelVolumesNeeded {
			continue
		}
		if ok, why := t.annotation(spec, k, v); !ok {
			ignored = append(ignored, fmt.Sprintf("annotation %s: %s", k, why))
			continue
		}
		annotations[k] = v
	}
	slices.Sort(ignored)
	asked := volume.Image{Labels: annotations}
	if v, ok := img.Getenv(envVisibleDevices); ok {
		if ok, why := t.env(spec, envVisibleDevices, v); ok {
			asked.Env = []string{envVisibleDevices + "=" + v}
		} else {
			ignored = append(ignored, fmt.Sprintf("%s=%s: %s", envVisibleDevices, v, why))
		}
	}
	ask, err := shareOf(spec, img, swarm, t)
	if err != nil {
		return Request{}, err
	}
	r, err := func() (Request, error) {
		if ask.GPU != "" {
			// A Swarm slice's id names its GPU: a GPU Swarm assigned
			// whole beside it is two claims on the node's resources.
			if len(swarmSources) > 0 {
				return Request{}, withRemedy(fmt.Errorf("%s beside %s: a task takes a slice or whole GPUs: %w", ask.Source, strings.Join(swarmSources, ", "), ErrInvalidShare),
					"ask the service for one of the two generic resources")
			}
			return Request{Devices: Devices{IDs: []string{ask.GPU}}, Source: ask.Source}, nil
		}
		if len(swarmSources) > 0 {
			d, err := ParseDevices(strings.Join(swarmIDs, ","))
			if err != nil {
				return Request{}, fmt.Errorf("%s: %w", strings.Join(swarmSources, ", "), err)
			}
			return Request{Devices: d, Source: strings.Join(swarmSources, ", ")}, nil
		}
		if r, err := cdiRequest(annotations, kind); err != nil || r.Source != "" {
			return r, err
		}
		if v, ok := asked.Getenv(envVisibleDevices); ok {
			d, err := ParseDevices(v)
			if err != nil {
				return Request{}, fmt.Errorf("%s: %w", envVisibleDevices, err)
			}
			return Request{Devices: d, Source: envVisibleDevices}, nil
		}
		return Request{}, nil
	}()
	if err != nil {
		return Request{}, err
	}
	ignored = append(ignored, ask.Ignored...)
	if share, source := ask.Share, ask.Source; share != nil {
		switch {
		case r.All:
			r.Devices = Devices{} // any GPU: the allocator's choice
		case len(r.IDs) > 1:
			return Request{}, fmt.Errorf("%s with %s naming %d devices: a share is of one GPU: %w", source, r.Source, len(r.IDs), ErrInvalidShare)
		case len(r.IDs) == 1 && strings.HasPrefix(r.IDs[0], "MIG-"):
			return Request{}, fmt.Errorf("%s with %s naming MIG device %s: MIG devices are not shared: %w", source, r.Source, r.IDs[0], ErrInvalidShare)
		}
		r.Share, r.ShareSource = share, source
	}
	r.Volume = asked.NeedsVolume()
	r.Ignored = ignored
	return r, nil
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

// allocation turns r into an allocator request on inv: a share of the one
// GPU named, or of the allocator's choice; every GPU of the node (by UUID)
// for All; else the named devices.
func (r Request) allocation(inv *node.Inventory) allocator.Request {
	if r.Share != nil {
		s := *r.Share
		return allocator.Request{Devices: slices.Clone(r.IDs), Share: &s}
	}
	d := r.Devices
	if !d.All {
		return allocator.Request{Devices: slices.Clone(d.IDs)}
	}
	var out allocator.Request
	for _, g := range inv.Devices {
		out.Devices = append(out.Devices, g.UUID)
	}
	return out
}

// ErrDeviceHeld: the spec's device list (docker run --device, podman run
// --device) holds the node of a GPU another container owns.
var ErrDeviceHeld = node.Sentinel(node.ErrUnavailable, "device held by another container")

// request reads what the spec of container id in bundle asks for, as
// --accept-env-request and the engine's record of the image decide, logs
// what it ignores, and, when the runtime owns GPUs, refuses a spec whose
// device list holds a GPU another container owns.
func (rt *Runtime) request(ctx context.Context, spec *specs.Spec, bundle, id string) (Request, error) {
	t := &trust{Policy: rt.AcceptEnv, CDIAnnotations: rt.AcceptCDIAnnotations, Load: func() (*engineRecord, error) { return findEngineRecord(bundle, id, spec) }}
	req, err := requestOf(spec, rt.CDIKind, rt.swarm(), t)
	if err != nil {
		return Request{}, err
	}
	for _, why := range req.Ignored {
		rt.Log.Info("not a request", "container", id, "setting", why, "policy", string(rt.AcceptEnv))
	}
	if rt.StateDir != "" {
		if err := rt.checkDevices(ctx, spec); err != nil {
			return Request{}, err
		}
	}
	return req, nil
}

// checkDevices refuses a spec whose device list holds the node of a GPU (or
// of a MIG device's capability) that a container owns in the state
// directory.
func (rt *Runtime) checkDevices(ctx context.Context, spec *specs.Spec) error {
	if spec.Linux == nil || !slices.ContainsFunc(spec.Linux.Devices, func(d specs.LinuxDevice) bool { return d.Type == "c" }) {
		return nil
	}
	inv, _, err := openNode(ctx, rt.Settings)
	if err != nil {
		return saysWhatToDo(err)
	}
	dir, err := filepath.Abs(rt.StateDir)
	if err != nil {
		return err
	}
	alloc, err := allocator.New(inv, allocator.WithStateDir(dir))
	if err != nil {
		return err
	}
	defer alloc.Close()
	// A container being created holds nothing yet: every owner is another.
	held := map[int][]string{} // inventory index -> owners
	for _, al := range alloc.Allocations() {
		for _, d := range al.Devices {
			held[d.Index] = append(held[d.Index], al.Owner)
		}
	}
	for _, d := range spec.Linux.Devices {
		if d.Type != "c" {
			continue
		}
		for _, g := range inv.Devices {
			if owners := held[g.Index]; len(owners) > 0 && g.Node.Path != "" && int64(g.Node.Major) == d.Major && int64(g.Node.Minor) == d.Minor {
				return fmt.Errorf("device %s is GPU %d (%s), owned by %s: %w", d.Path, g.Index, g.UUID, strings.Join(owners, ", "), ErrDeviceHeld)
			}
			for _, m := range g.MIGDevices {
				for _, c := range []node.DeviceNode{m.GIAccess, m.CIAccess} {
					if owners := held[g.Index]; len(owners) > 0 && c.Path != "" && int64(c.Major) == d.Major && int64(c.Minor) == d.Minor {
						return fmt.Errorf("device %s is a capability of GPU %d (%s), owned by %s: %w", d.Path, g.Index, g.UUID, strings.Join(owners, ", "), ErrDeviceHeld)
					}
				}
			}
		}
	}
	return nil
}

// freeView is how a request for "all" is served when the runtime owns GPUs:
// it claims nothing, and shows the container the GPUs no container holds
// now. It returns the request of those GPUs (none when every GPU is held)
// and an allocator of the node's own, with no state directory, to place it
// in: nothing is written to the shared state.
func freeView(inv *node.Inventory, shared *allocator.Allocator) (allocator.Request, *allocator.Allocator, error) {
	view, err := allocator.New(inv)
	if err != nil {
		return allocator.Request{}, nil, err
	}
	var r allocator.Request
	for _, p := range shared.Free() {
		r.Devices = append(r.Devices, inv.Devices[p].UUID)
	}
	return r, view, nil
}
