package deviceplugin

import (
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/nomad/internal/hclspecutil"
)

// encode writes config as Nomad sends it.
func encode(tb testing.TB, config map[string]any) []byte {
	tb.Helper()
	data, err := hclspecutil.Encode(Spec(), config)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

// TestDecodeConfig: an empty block and no data are the defaults; every key
// is read as Nomad encodes it.
func TestDecodeConfig(t *testing.T) {
	for _, data := range [][]byte{nil, encode(t, nil)} {
		c, err := DecodeConfig(data)
		if err != nil || !reflect.DeepEqual(c, DefaultConfig()) {
			t.Fatalf("DecodeConfig(%x) = %+v, %v; want the defaults", data, c, err)
		}
	}
	c, err := DecodeConfig(encode(t, map[string]any{
		"enabled": false, "ignored_gpu_ids": []string{"GPU-1", " 2 "}, "fingerprint_period": "5s",
		"state_dir": "/s", "driver_root": "/d", "mig": "whole", "env": "runtime",
		"simulate": "pcie8", "dev_root": "/n", "nomad_addr": "http://127.0.0.1:4646", "nomad_token": "t",
	}))
	want := Config{Enabled: false, IgnoredGPUIDs: []string{"GPU-1", "2"}, FingerprintPeriod: 5 * time.Second,
		StateDir: "/s", DriverRoot: "/d", MIG: MIGWhole, Env: EnvRuntime, Simulate: "pcie8", DevRoot: "/n",
		NomadAddr: "http://127.0.0.1:4646", NomadToken: "t"}
	if err != nil || !reflect.DeepEqual(c, want) {
		t.Fatalf("DecodeConfig = %+v, %v; want %+v", c, err, want)
	}
}

// FuzzDecodeConfig: no input panics, and what decodes is a valid
// configuration; what does not is an ErrInvalidConfig.
func FuzzDecodeConfig(f *testing.F) {
	f.Add(encode(f, nil))
	f.Add(encode(f, map[string]any{"env": "runtime", "mig": "mig", "ignored_gpu_ids": []string{"0"}}))
	f.Add([]byte{0x80})
	f.Add([]byte{0xc1})
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := DecodeConfig(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("DecodeConfig(%x): %v, not an ErrInvalidConfig", data, err)
			}
			return
		}
		if c.FingerprintPeriod <= 0 || !slices.Contains([]EnvMode{EnvDevices, EnvRuntime}, c.Env) || !slices.Contains([]MIGMode{MIGBoth, MIGWhole, MIGOnly}, c.MIG) {
			t.Fatalf("DecodeConfig(%x) = %+v: not a valid configuration", data, c)
		}
	})
}
