package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/volume"
)

// shareAsk is the share a spec asks for.
type shareAsk struct {
	// Share is the share, nil for none; Source names where it came from.
	Share  *allocator.Share
	Source string
	// GPU is the GPU the request itself names (a Swarm slice's id), ""
	// for none.
	GPU string
	// Ignored are the settings that are no request, with why.
	Ignored []string
}

// shareOf reads the share spec asks for: a memory share by Swarm's memory
// resource (DOCKER_RESOURCE_<swarm.Memory>=<MiB>, trusted as Swarm's GPUs
// are), else GPUISO_GPU_MEMORY (a size, trusted as NVIDIA_VISIBLE_DEVICES
// is), and a compute percentage from GPUISO_GPU_COMPUTE; a concurrent
// slice by Swarm's slice resource (DOCKER_RESOURCE_<swarm.Slice>=<GPU>::<k>,
// trusted as Swarm's GPUs are; see parseSwarmSlice) or GPUISO_GPU_SLICES
// (its count), a time slice by GPUISO_GPU_TIME_SLICE, each trusted as
// GPUISO_GPU_MEMORY is. Two kinds asked at once (Swarm's memory and slice
// resources included), or a compute percentage beside a slice, is
// ErrInvalidShare.
func shareOf(spec *specs.Spec, img volume.Image, swarm swarmNames, t *trust) (shareAsk, error) {
	var ignored []string
	var share *allocator.Share
	source, gpu := "", ""
	fail := func(err error) (shareAsk, error) { return shareAsk{}, err }
	if swarm.Memory != "" {
		key := swarmKey(swarm.Memory)
		if v, ok := img.Getenv(key); ok {
			if ok, why := t.swarm(key, v); !ok {
				ignored = append(ignored, fmt.Sprintf("%s: %s", key, why))
			} else {
				mib, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				if err != nil || mib == 0 || mib > maxShareMiB {
					return fail(fmt.Errorf("%s=%s: want a whole number of MiB from 1 to %d: %w", key, quoteShort(v), maxShareMiB, ErrInvalidShare))
				}
				share, source = &allocator.Share{Mode: allocator.ShareMemory, MemoryBytes: mib << 20}, key
			}
		}
	}
	if swarm.Slice != "" {
		key := swarm.sliceKey()
		if v, ok := img.Getenv(key); ok {
			if ok, why := t.swarm(key, v); !ok {
				ignored = append(ignored, fmt.Sprintf("%s: %s", key, why))
			} else {
				g, s, err := parseSwarmSlice(key, v, swarm.Slices)
				if err != nil {
					return fail(err)
				}
				if share != nil {
					return fail(withRemedy(fmt.Errorf("%s=%s beside %s: a GPU is shared one way: %w", key, quoteShort(v), source, ErrInvalidShare),
						"ask the service for one of the two generic resources"))
				}
				share, source, gpu = s, key, g
			}
		}
	}
	if v, ok := img.Getenv(envGPUMemory); ok {
		switch ok, why := t.env(spec, envGPUMemory, v); {
		case !ok:
			ignored = append(ignored, fmt.Sprintf("%s=%s: %s", envGPUMemory, v, why))
		case share != nil:
			ignored = append(ignored, fmt.Sprintf("%s=%s: %s asks already", envGPUMemory, v, source))
		default:
			b, err := parseGPUMemory(v)
			if err != nil {
				return fail(err)
			}
			share, source = &allocator.Share{Mode: allocator.ShareMemory, MemoryBytes: b}, envGPUMemory
		}
	}
	for _, key := range []string{envGPUSlices, envGPUTimeSlice} {
		v, ok := img.Getenv(key)
		if !ok {
			continue
		}
		if ok, why := t.env(spec, key, v); !ok {
			ignored = append(ignored, fmt.Sprintf("%s=%s: %s", key, v, why))
			continue
		}
		s, err := parseSlice(key, v)
		if err != nil {
			return fail(err)
		}
		if s == nil {
			continue // GPUISO_GPU_TIME_SLICE=0: none asked
		}
		if share != nil {
			return fail(fmt.Errorf("%s=%s beside %s: a GPU is shared one way: %w", key, quoteShort(v), source, ErrInvalidShare))
		}
		share, source = s, key
	}
	if v, ok := img.Getenv(envGPUCompute); ok {
		if ok, why := t.env(spec, envGPUCompute, v); !ok {
			ignored = append(ignored, fmt.Sprintf("%s=%s: %s", envGPUCompute, v, why))
		} else {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			switch {
			case err != nil || n < 1 || n > 100:
				return fail(fmt.Errorf("%s=%s: want a percentage from 1 to 100: %w", envGPUCompute, quoteShort(v), ErrInvalidShare))
			case share == nil || share.Mode != allocator.ShareMemory:
				return fail(fmt.Errorf("%s=%s without a memory share (%s, or Swarm's %s): %w", envGPUCompute, v, envGPUMemory, swarmKey(swarm.Memory), ErrInvalidShare))
			}
			share.ComputePercent = n
			source += ", " + envGPUCompute
		}
	}
	return shareAsk{Share: share, Source: source, GPU: gpu, Ignored: ignored}, nil
}

// parseSwarmSlice reads the slice Docker Swarm assigned a task, the value
// v of key (DOCKER_RESOURCE_<slice resource>): one id "<GPU>::<k>", GPU an
// index or a GPU- UUID, k a slice's number from 0 to n-1, n the count of
// slices each GPU is split in (--swarm-slices). It returns the GPU and the
// share: one of n concurrent slices. Several ids (a service asking for
// more than one) are refused: a container holds one share, and two slices
// are neither one bigger slice under the GPU's MPS daemon nor one share of
// two GPUs. So is any id that is not of that form, and any id at all when
// n is not set.
func parseSwarmSlice(key, v string, n int) (string, *allocator.Share, error) {
	resource := strings.TrimPrefix(key, envSwarmPrefix)
	ids := strings.Split(strings.TrimSpace(v), ",")
	switch {
	case n == 0:
		return "", nil, withRemedy(fmt.Errorf("%s=%s: the count of slices per GPU is not set: %w", key, quoteShort(v), ErrInvalidShare),
			"give gpuiso-runtime --swarm-slices N, N the count of "+resource+" ids the node advertises per GPU")
	case len(ids) > 1:
		return "", nil, withRemedy(fmt.Errorf("%s=%s: Swarm assigned %d slices, and a task takes one: %w", key, quoteShort(v), len(ids), ErrInvalidShare),
			"ask the service for one slice (--generic-resource "+resource+"=1)")
	}
	bad := func(why string, err error) (string, *allocator.Share, error) {
		if err != nil {
			why += ": " + err.Error()
		}
		return "", nil, withRemedy(fmt.Errorf("%s=%s: %s: %w", key, quoteShort(v), why, ErrInvalidShare),
			fmt.Sprintf("advertise the node's slices as %s=<GPU index or GPU- UUID>%s<k>, k from 0 to %d", resource, sliceIDSep, n-1))
	}
	id := strings.TrimSpace(ids[0])
	g, k, ok := strings.Cut(id, sliceIDSep)
	if !ok {
		return bad(fmt.Sprintf("%s is no <GPU>%s<slice> id", quoteShort(id), sliceIDSep), nil)
	}
	if g == "all" || g == "none" || g == "void" {
		return bad(fmt.Sprintf("its GPU: %q names no one GPU", g), nil)
	}
	if err := validID(g); err != nil {
		return bad("its GPU", err)
	}
	if strings.HasPrefix(g, "MIG-") {
		return bad("MIG device "+g+": MIG devices are not shared", nil)
	}
	i, err := strconv.Atoi(k)
	if err != nil || k == "" || strings.Trim(k, "0123456789") != "" || i >= n {
		return bad(fmt.Sprintf("slice %q: want a number from 0 to %d (--swarm-slices %d)", k, n-1, n), nil)
	}
	return g, &allocator.Share{Mode: allocator.ShareSlice, Slices: n}, nil
}

// parseSlice reads GPUISO_GPU_SLICES (a count from allocator.MinSlices to
// allocator.MaxSlices: a concurrent slice) or GPUISO_GPU_TIME_SLICE (1 or
// true: a time slice; 0 or false: none, nil).
func parseSlice(key, v string) (*allocator.Share, error) {
	t := strings.TrimSpace(v)
	if key == envGPUTimeSlice {
		switch strings.ToLower(t) {
		case "1", "true":
			return &allocator.Share{Mode: allocator.ShareTime}, nil
		case "0", "false":
			return nil, nil
		}
		return nil, fmt.Errorf("%s=%s: want 1 or true (0 or false: none): %w", key, quoteShort(v), ErrInvalidShare)
	}
	n, err := strconv.Atoi(t)
	s := &allocator.Share{Mode: allocator.ShareSlice, Slices: n}
	if err != nil || s.Validate() != nil {
		return nil, fmt.Errorf("%s=%s: want a count of slices from %d to %d: %w", key, quoteShort(v), allocator.MinSlices, allocator.MaxSlices, ErrInvalidShare)
	}
	return s, nil
}

// parseGPUMemory reads GPUISO_GPU_MEMORY: a size with its unit (4GiB,
// 4096MiB, 8000M, 4096B for bytes). A bare number is refused: Swarm's
// VRAM counts MiB and gpurun's sizes bytes, and either guess would give a
// share a thousand or a million times off.
func parseGPUMemory(v string) (uint64, error) {
	if t := strings.TrimSpace(v); t != "" && strings.Trim(t, "0123456789") == "" {
		return 0, withRemedy(fmt.Errorf("%s=%s: a size without a unit: %w", envGPUMemory, quoteShort(v), ErrInvalidShare),
			fmt.Sprintf("give its unit, as %s=%sMiB (or B, KiB, GiB, TiB; KB, MB, GB, TB)", envGPUMemory, t))
	}
	b, err := allocator.ParseBytes(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %w: %w", envGPUMemory, ErrInvalidShare, err)
	}
	return b, nil
}
