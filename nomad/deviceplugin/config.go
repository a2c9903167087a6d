package deviceplugin

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2/hcldec"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/gocty"
	ctymsgpack "github.com/zclconf/go-cty/cty/msgpack"

	"github.com/gpuiso/gpuiso/node/simnode"
	"github.com/gpuiso/gpuiso/nomad/internal/hclspecutil"
	"github.com/gpuiso/gpuiso/nomad/internal/proto/hclspec"
)

// EnvMode is how a reservation isolates the task's GPUs.
type EnvMode string

const (
	// EnvDevices hands the task the device nodes of exactly its GPUs,
	// the driver volume read-only and the environment CUDA needs, and no
	// NVIDIA_VISIBLE_DEVICES (so Nomad's docker driver keeps the default
	// runtime). The plugin holds the GPUs in gpuiso's allocator state.
	EnvDevices EnvMode = "devices"
	// EnvRuntime hands the task NVIDIA_VISIBLE_DEVICES alone, for Nomad's
	// docker driver with nvidia_runtime = "gpuiso": gpuiso-runtime then
	// isolates and holds the GPUs for the container's life.
	EnvRuntime EnvMode = "runtime"
)

// MIGMode says which devices of a node with MIG enabled are offered.
type MIGMode string

const (
	// MIGBoth offers whole GPUs and MIG devices.
	MIGBoth MIGMode = "both"
	// MIGWhole offers whole GPUs only (GPUs split into MIG devices are
	// left out).
	MIGWhole MIGMode = "whole"
	// MIGOnly offers MIG devices only.
	MIGOnly MIGMode = "mig"
)

// DefaultFingerprintPeriod is how often the devices' health is read again
// unless fingerprint_period says otherwise.
const DefaultFingerprintPeriod = time.Minute

// Config is the plugin block's configuration, checked.
type Config struct {
	// Enabled, when false, makes the plugin fingerprint no device.
	Enabled bool
	// IgnoredGPUIDs are devices (UUIDs, "GPU-" or "MIG-") not offered.
	IgnoredGPUIDs []string
	// FingerprintPeriod is how often health and the allocation list are
	// read again.
	FingerprintPeriod time.Duration
	// StateDir is gpuiso's allocator state directory, shared with
	// gpuiso-runtime, gpurun and other plugins of the node; empty: the
	// plugin's own state, in memory.
	StateDir string
	// DriverRoot is where the NVIDIA driver is installed (default: the
	// host's root).
	DriverRoot string
	// MIG says which devices of GPUs with MIG enabled are offered.
	MIG MIGMode
	// Env is how reservations isolate.
	Env EnvMode
	// Simulate names a simulated node (see simnode.Names); DevRoot is then
	// the directory of its host tree. Without Simulate, DevRoot moves the
	// real node's /dev.
	Simulate string
	DevRoot  string
	// NomadAddr and NomadToken reach the agent's HTTP API, where the
	// node's allocations are read (default: NOMAD_ADDR and NOMAD_TOKEN, else
	// http://127.0.0.1:4646).
	NomadAddr  string
	NomadToken string
}

// rawConfig is the configuration as the spec decodes it.
type rawConfig struct {
	Enabled           bool     `cty:"enabled"`
	IgnoredGPUIDs     []string `cty:"ignored_gpu_ids"`
	FingerprintPeriod string   `cty:"fingerprint_period"`
	StateDir          string   `cty:"state_dir"`
	DriverRoot        string   `cty:"driver_root"`
	MIG               string   `cty:"mig"`
	Env               string   `cty:"env"`
	Simulate          string   `cty:"simulate"`
	DevRoot           string   `cty:"dev_root"`
	NomadAddr         string   `cty:"nomad_addr"`
	NomadToken        string   `cty:"nomad_token"`
}

// Spec is the plugin block's schema, as ConfigSchema returns it: every key
// optional, with its default.
func Spec() *hclspec.Spec {
	attr := func(name, ty, def string) *hclspec.Spec {
		return &hclspec.Spec{Block: &hclspec.Spec_Default{Default: &hclspec.Default{
			Primary: &hclspec.Spec{Block: &hclspec.Spec_Attr{Attr: &hclspec.Attr{Name: name, Type: ty}}},
			Default: &hclspec.Spec{Block: &hclspec.Spec_Literal{Literal: &hclspec.Literal{Value: def}}},
		}}}
	}
	return &hclspec.Spec{Block: &hclspec.Spec_Object{Object: &hclspec.Object{Attributes: map[string]*hclspec.Spec{
		"enabled":            attr("enabled", "bool", "true"),
		"ignored_gpu_ids":    attr("ignored_gpu_ids", "list(string)", "[]"),
		"fingerprint_period": attr("fingerprint_period", "string", `"1m"`),
		"state_dir":          attr("state_dir", "string", `""`),
		"driver_root":        attr("driver_root", "string", `""`),
		"mig":                attr("mig", "string", `"both"`),
		"env":                attr("env", "string", `"devices"`),
		"simulate":           attr("simulate", "string", `""`),
		"dev_root":           attr("dev_root", "string", `""`),
		"nomad_addr":         attr("nomad_addr", "string", `""`),
		"nomad_token":        attr("nomad_token", "string", `""`),
	}}}}
}

// DefaultConfig is the configuration of an empty plugin block.
func DefaultConfig() Config {
	return Config{Enabled: true, FingerprintPeriod: DefaultFingerprintPeriod, MIG: MIGBoth, Env: EnvDevices}
}

// DecodeConfig reads the configuration SetConfig carries: the plugin block
// decoded with Spec, in go-cty's msgpack encoding. Empty data is an empty
// block. A key the spec does not have, a value of the wrong type or a
// value out of range is an error matching ErrInvalidConfig.
func DecodeConfig(data []byte) (Config, error) {
	if len(data) == 0 {
		return DefaultConfig(), nil
	}
	if err := checkMsgpack(data); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	spec, err := hclspecutil.Decoder(Spec())
	if err != nil {
		return Config{}, err
	}
	want := hcldec.ImpliedType(spec)
	if got, err := ctymsgpack.ImpliedType(data); err == nil && got.IsObjectType() {
		var unknown []string
		for name := range got.AttributeTypes() {
			if !want.HasAttribute(name) {
				unknown = append(unknown, strconv.Quote(name))
			}
		}
		if len(unknown) > 0 {
			slices.Sort(unknown)
			return Config{}, fmt.Errorf("%w: unknown key %s", ErrInvalidConfig, strings.Join(unknown, ", "))
		}
	}
	val, err := ctymsgpack.Unmarshal(data, want)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if val.IsNull() || !val.IsWhollyKnown() {
		return Config{}, fmt.Errorf("%w: no value", ErrInvalidConfig)
	}
	// A key left out of the block is null where the encoder did not apply
	// the spec's defaults; give it the default.
	def := DefaultConfig()
	attrs := val.AsValueMap()
	defaults := map[string]cty.Value{
		"enabled":            cty.BoolVal(def.Enabled),
		"ignored_gpu_ids":    cty.ListValEmpty(cty.String),
		"fingerprint_period": cty.StringVal(def.FingerprintPeriod.String()),
		"mig":                cty.StringVal(string(def.MIG)),
		"env":                cty.StringVal(string(def.Env)),
	}
	for k, v := range attrs {
		if v.IsNull() {
			if d, ok := defaults[k]; ok {
				attrs[k] = d
			} else {
				attrs[k] = cty.StringVal("")
			}
		}
	}
	var raw rawConfig
	if err := gocty.FromCtyValue(cty.ObjectVal(attrs), &raw); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return raw.check()
}

// check validates raw and returns it as a Config.
func (raw rawConfig) check() (Config, error) {
	c := Config{
		Enabled:    raw.Enabled,
		StateDir:   raw.StateDir,
		DriverRoot: raw.DriverRoot,
		MIG:        MIGMode(raw.MIG),
		Env:        EnvMode(raw.Env),
		Simulate:   raw.Simulate,
		DevRoot:    raw.DevRoot,
		NomadAddr:  raw.NomadAddr,
		NomadToken: raw.NomadToken,
	}
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalidConfig, key, fmt.Sprintf(format, a...)))
	}
	for _, id := range raw.IgnoredGPUIDs {
		if strings.TrimSpace(id) == "" {
			bad("ignored_gpu_ids", "empty id")
			continue
		}
		c.IgnoredGPUIDs = append(c.IgnoredGPUIDs, strings.TrimSpace(id))
	}
	d, err := time.ParseDuration(raw.FingerprintPeriod)
	switch {
	case err != nil:
		bad("fingerprint_period", "%q is not a duration (\"30s\", \"1m\")", raw.FingerprintPeriod)
	case d <= 0:
		bad("fingerprint_period", "%q is not positive", raw.FingerprintPeriod)
	}
	c.FingerprintPeriod = d
	if !slices.Contains([]MIGMode{MIGBoth, MIGWhole, MIGOnly}, c.MIG) {
		bad("mig", "%q is none of both, whole, mig", raw.MIG)
	}
	if !slices.Contains([]EnvMode{EnvDevices, EnvRuntime}, c.Env) {
		bad("env", "%q is none of devices, runtime", raw.Env)
	}
	for key, dir := range map[string]string{"state_dir": c.StateDir, "driver_root": c.DriverRoot, "dev_root": c.DevRoot} {
		if dir != "" && !filepath.IsAbs(dir) {
			bad(key, "%q is not an absolute path", dir)
		}
	}
	if c.Simulate != "" {
		if !slices.Contains(simnode.Names(), c.Simulate) {
			bad("simulate", "%q is no simulated node (%s)", c.Simulate, strings.Join(simnode.Names(), ", "))
		}
		if c.DevRoot == "" {
			bad("dev_root", "simulate needs the directory of the simulated node's host tree")
		}
	}
	if c.NomadAddr != "" {
		u, err := url.Parse(c.NomadAddr)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "unix") || (u.Host == "" && u.Scheme != "unix") {
			bad("nomad_addr", "%q is not an http, https or unix URL", c.NomadAddr)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	return c, nil
}
