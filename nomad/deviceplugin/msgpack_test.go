package deviceplugin

import (
	"bytes"
	"errors"
	"testing"
)

// TestCheckMsgpack: a header that claims more than the bytes left, too
// deep a nesting, an unused code or trailing bytes is refused before any
// decoder allocates what it claims; what Nomad encodes passes.
func TestCheckMsgpack(t *testing.T) {
	for name, data := range map[string][]byte{
		"array32 of 4e9":  {0xdd, 0xf0, 0xd9, 0xb6, 0xe9, 0x8e, 0x7a, 0xa7},
		"map32 of 4e9":    {0xdf, 0xff, 0xff, 0xff, 0xff, 0x01},
		"array16 short":   {0xdc, 0x00, 0x03, 0x01, 0x02},
		"str32 of 4e9":    {0xdb, 0xff, 0xff, 0xff, 0xff, 'a'},
		"bin8 short":      {0xc4, 0x05, 'a'},
		"ext32 short":     {0xc9, 0x00, 0x00, 0x00, 0x02, 0x01, 'a'},
		"fixext16 short":  {0xd8, 0x01, 0x02},
		"uint64 short":    {0xcf, 0x01},
		"length cut":      {0xdd, 0x00},
		"never used":      {0xc1},
		"trailing":        {0x80, 0x00},
		"empty":           {},
		"nested too deep": append(bytes.Repeat([]byte{0x91}, maxMsgpackDepth+2), 0x00),
	} {
		if err := checkMsgpack(data); !errors.Is(err, errMsgpackShape) {
			t.Errorf("%s (%x): %v, want refused", name, data, err)
		}
		if _, err := DecodeConfig(data); len(data) > 0 && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: DecodeConfig: %v, want ErrInvalidConfig", name, err)
		}
	}
	for name, data := range map[string][]byte{
		"defaults":     encode(t, nil),
		"every key":    encode(t, map[string]any{"env": "runtime", "mig": "mig", "ignored_gpu_ids": []string{"0", "GPU-1"}, "fingerprint_period": "5s", "state_dir": "/var/lib/gpuiso"}),
		"scalars":      {0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xd3, 0, 0, 0, 0, 0, 0, 0, 1, 0xd6, 1, 1, 2, 3, 4},
		"nested":       append(bytes.Repeat([]byte{0x91}, maxMsgpackDepth), 0xc0),
		"str8 and bin": {0x92, 0xd9, 0x01, 'a', 0xc5, 0x00, 0x01, 'b'},
	} {
		if err := checkMsgpack(data); err != nil {
			t.Errorf("%s (%x): %v", name, data, err)
		}
	}
}
