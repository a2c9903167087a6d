package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
)

// ownedKeys are the members of config.json that the isolation writes
// (oci.Apply): the process's environment, the device nodes, the device
// cgroup rules and the mounts; and the cgroup's path where the engine left
// it empty (ownCgroup).
var ownedKeys = [][]string{{"process", "env"}, {"linux", "devices"}, {"linux", "resources", "devices"}, {"mounts"}, {"linux", "cgroupsPath"}}

// patchSpec returns raw, the config.json an engine wrote, with the members
// of ownedKeys set to spec's where they differ (an empty cgroup path is
// left as it is): every other byte, unknown members included, stays as the
// engine wrote it. A member that is missing is added at the end of its
// object.
func patchSpec(raw []byte, spec *specs.Spec) ([]byte, error) {
	var env, devices, rules, mounts, cgroup any
	if spec.Process != nil {
		env = spec.Process.Env
	}
	if spec.Linux != nil {
		devices = spec.Linux.Devices
		if spec.Linux.Resources != nil {
			rules = spec.Linux.Resources.Devices
		}
		if spec.Linux.CgroupsPath != "" {
			cgroup = spec.Linux.CgroupsPath
		}
	}
	mounts = spec.Mounts
	out := raw
	for i, v := range []any{env, devices, rules, mounts, cgroup} {
		if i == 4 && v == nil {
			continue
		}
		key := ownedKeys[i]
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		old, found, err := lookupJSON(out, key)
		if err != nil {
			return nil, err
		}
		if found && sameJSON(old, b, v) {
			continue
		}
		if !found && string(b) == "null" {
			continue
		}
		if out, err = setJSON(out, key, b); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ownCgroup gives spec, whose container owner gpuiso-runtime isolates, a
// cgroup of its own where the engine named none. runc then names the
// cgroup after the container's id alone (cgroupfs: the id, under the
// caller's own cgroup; systemd: the scope runc-ID), so that containers of
// one id in two runc roots would share one cgroup, and the device rules
// of the last created would be both containers'. The path given is runc's
// default with the owner (the id and its root) for the id. runcArgs are
// runc's global flags (--systemd-cgroup chooses the form).
func ownCgroup(spec *specs.Spec, owner string, runcArgs []string) {
	if spec.Linux == nil {
		spec.Linux = &specs.Linux{}
	}
	if spec.Linux.CgroupsPath != "" {
		return
	}
	spec.Linux.CgroupsPath = owner
	for _, a := range runcArgs {
		if name, value, _ := strings.Cut(strings.TrimLeft(a, "-"), "="); name == "systemd-cgroup" && value != "false" {
			spec.Linux.CgroupsPath = ":runc:" + owner // runc's default slice and prefix
		}
	}
}

// sameJSON reports whether the JSON old reads as v (whose encoding is b):
// old decoded into v's type encodes as b.
func sameJSON(old, b []byte, v any) bool {
	var again any
	switch v.(type) {
	case []string:
		again = new([]string)
	case []specs.LinuxDevice:
		again = new([]specs.LinuxDevice)
	case []specs.LinuxDeviceCgroup:
		again = new([]specs.LinuxDeviceCgroup)
	case []specs.Mount:
		again = new([]specs.Mount)
	case string:
		again = new(string)
	default:
		return false
	}
	if err := json.Unmarshal(old, again); err != nil {
		return false
	}
	c, err := json.Marshal(again)
	return err == nil && bytes.Equal(c, b)
}

// member is where one member of a JSON object lies in its text.
type member struct {
	key        string
	start, end int // the value's bytes
}

// members lists the members of the JSON object doc (leading and trailing
// white space allowed) and the offset of its closing brace.
func members(doc []byte) (ms []member, closing int, err error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, 0, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, 0, errors.New("not a JSON object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, 0, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, 0, fmt.Errorf("object key %v", tok)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, 0, err
		}
		end := int(dec.InputOffset())
		ms = append(ms, member{key: key, start: end - len(v), end: end})
	}
	if _, err := dec.Token(); err != nil {
		return nil, 0, err
	}
	closing = int(dec.InputOffset()) - 1
	if closing < 0 || doc[closing] != '}' {
		return nil, 0, errors.New("unterminated JSON object")
	}
	return ms, closing, nil
}

// find returns the member named key that a decoder into a Go struct keeps
// (runc is one): the last whose name matches key without regard to case.
func find(ms []member, key string) (member, bool) {
	for i := len(ms) - 1; i >= 0; i-- {
		if strings.EqualFold(ms[i].key, key) {
			return ms[i], true
		}
	}
	return member{}, false
}

// lookupJSON returns the value at path in the JSON object doc.
func lookupJSON(doc []byte, path []string) ([]byte, bool, error) {
	ms, _, err := members(doc)
	if err != nil {
		return nil, false, err
	}
	m, ok := find(ms, path[0])
	if !ok {
		return nil, false, nil
	}
	v := doc[m.start:m.end]
	if len(path) == 1 {
		return v, true, nil
	}
	if string(v) == "null" {
		return nil, false, nil
	}
	return lookupJSON(v, path[1:])
}

// setJSON sets the value at path in the JSON object doc to value, making
// the objects on the way that are missing (or null), and changes nothing
// else of doc.
func setJSON(doc []byte, path []string, value []byte) ([]byte, error) {
	ms, closing, err := members(doc)
	if err != nil {
		return nil, err
	}
	m, ok := find(ms, path[0])
	if ok && len(path) > 1 && string(doc[m.start:m.end]) != "null" {
		value, err = setJSON(doc[m.start:m.end], path[1:], value)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path[0], err)
		}
	} else if len(path) > 1 {
		for i := len(path) - 1; i >= 1; i-- {
			value = []byte("{" + strconv.Quote(path[i]) + ":" + string(value) + "}")
		}
	}
	var out bytes.Buffer
	if ok {
		out.Write(doc[:m.start])
		out.Write(value)
		out.Write(doc[m.end:])
		return out.Bytes(), nil
	}
	out.Write(doc[:closing])
	if len(ms) > 0 {
		out.WriteByte(',')
	}
	out.WriteString(strconv.Quote(path[0]) + ":")
	out.Write(value)
	out.Write(doc[closing:])
	return out.Bytes(), nil
}
