package main

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"
)

// engineConfig is a config.json as an engine might write it: members this
// version of the runtime spec does not know, at the top and inside
// process, keys in no particular order, its own spacing.
const engineConfig = `{
  "ociVersion": "1.2.0",
  "x-engine-future":   {"nested": [1, 2.50, "three"], "flag" : true},
  "process": {
    "x-process-future" : {"a":1},
    "args": ["/probe"],
    "env": [
      "PATH=/bin",
      "NVIDIA_VISIBLE_DEVICES=2"
    ],
    "cwd": "/"
  },
  "root": {"path": "rootfs"},
  "linux": {"x-linux-future": "keep", "devices": [], "namespaces": [{"type": "mount"}]},
  "annotations": {"z": "1", "a": "2"}
}
`

// TestPatchSpec: the isolation's members (process.env, linux.devices,
// linux.resources.devices, mounts) are set; every other byte of the file
// stays as the engine wrote it.
func TestPatchSpec(t *testing.T) {
	var spec specs.Spec
	if err := json.Unmarshal([]byte(engineConfig), &spec); err != nil {
		t.Fatal(err)
	}
	major, minor := int64(195), int64(2)
	spec.Process.Env = append(spec.Process.Env, "CUDA_VISIBLE_DEVICES=GPU-x")
	spec.Linux.Devices = append(spec.Linux.Devices, specs.LinuxDevice{Path: "/dev/nvidia2", Type: "c", Major: major, Minor: minor})
	spec.Linux.Resources = &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}, {Allow: true, Type: "c", Major: &major, Minor: &minor, Access: "rw"}}}
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/usr/local/nvidia", Source: "/var/lib/gpuiso/v", Type: "bind", Options: []string{"ro", "rbind"}})
	out, err := patchSpec([]byte(engineConfig), &spec)
	if err != nil {
		t.Fatal(err)
	}
	// Unknown members, byte for byte, in their order.
	kept := []string{
		`"ociVersion": "1.2.0"`,
		`"x-engine-future":   {"nested": [1, 2.50, "three"], "flag" : true}`,
		`"x-process-future" : {"a":1}`,
		`"args": ["/probe"]`,
		`"cwd": "/"`,
		`"root": {"path": "rootfs"}`,
		`"x-linux-future": "keep"`,
		`"namespaces": [{"type": "mount"}]`,
		`"annotations": {"z": "1", "a": "2"}`,
	}
	last := -1
	for _, k := range kept {
		i := bytes.Index(out, []byte(k))
		if i < 0 || i < last {
			t.Errorf("%s: lost or moved in\n%s", k, out)
		}
		last = i
	}
	if !bytes.HasSuffix(out, []byte("}\n")) {
		t.Errorf("the file's end changed:\n%s", out)
	}
	var got specs.Spec
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !slices.Equal(got.Process.Env, spec.Process.Env) || len(got.Linux.Devices) != 1 || got.Linux.Resources == nil ||
		len(got.Linux.Resources.Devices) != 2 || len(got.Mounts) != 1 {
		t.Errorf("owned members not written:\n%s", out)
	}

	t.Run("nothing changed", func(t *testing.T) {
		var spec specs.Spec
		if err := json.Unmarshal([]byte(engineConfig), &spec); err != nil {
			t.Fatal(err)
		}
		out, err := patchSpec([]byte(engineConfig), &spec)
		if err != nil || string(out) != engineConfig {
			t.Errorf("%v\n%s", err, out)
		}
	})
	t.Run("members made", func(t *testing.T) {
		in := `{"ociVersion":"1.2.0","linux":{}, "process": null}`
		spec := specs.Spec{Process: &specs.Process{Env: []string{"A=1"}}, Linux: &specs.Linux{Resources: &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Access: "rwm"}}}}}
		out, err := patchSpec([]byte(in), &spec)
		if err != nil {
			t.Fatal(err)
		}
		var got specs.Spec
		if err := json.Unmarshal(out, &got); err != nil || got.Process == nil || !slices.Equal(got.Process.Env, []string{"A=1"}) ||
			got.Linux.Resources == nil || len(got.Linux.Resources.Devices) != 1 || !strings.HasPrefix(string(out), `{"ociVersion":"1.2.0",`) {
			t.Errorf("%v\n%s", err, out)
		}
	})
	t.Run("not an object", func(t *testing.T) {
		if _, err := patchSpec([]byte(`[1]`), &spec); err == nil {
			t.Error("no error")
		}
	})
}

// FuzzPatchSpec: for any config.json that decodes, patching a changed
// environment never panics, gives JSON that decodes to that environment,
// and keeps every other member's value.
func FuzzPatchSpec(f *testing.F) {
	for _, s := range []string{engineConfig, `{}`, `{"process":null}`, `{"process":{"env":["A=1"]},"process":{"env":["B=2"]}}`,
		`{"linux":{"resources":{"devices":[{"allow":false,"access":"rwm"}]}},"x":[1,{"y":"}"}]}`, "{\"a\":\"\\u007d\",\"process\":{}}\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var spec specs.Spec
		if json.Unmarshal([]byte(in), &spec) != nil {
			return
		}
		var before map[string]json.RawMessage
		if json.Unmarshal([]byte(in), &before) != nil {
			return
		}
		if spec.Process == nil {
			spec.Process = &specs.Process{}
		}
		spec.Process.Env = append(spec.Process.Env, "GPUISO=1")
		out, err := patchSpec([]byte(in), &spec)
		if err != nil {
			return // not an object the patcher reads: Prepare refuses it
		}
		var got specs.Spec
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("patched %q: %v\n%s", in, err, out)
		}
		if got.Process == nil || !slices.Equal(got.Process.Env, spec.Process.Env) {
			t.Fatalf("patched %q: env %v, want %v\n%s", in, got.Process, spec.Process.Env, out)
		}
		var after map[string]json.RawMessage
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatal(err)
		}
		for k, v := range before {
			if !strings.EqualFold(k, "process") && !bytes.Equal(after[k], v) {
				t.Fatalf("patched %q: member %s changed: %s -> %s", in, k, v, after[k])
			}
		}
	})
}
