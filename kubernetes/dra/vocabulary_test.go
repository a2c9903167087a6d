package dra_test

import (
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/kubernetes/deviceplugin"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
	"github.com/gpuiso/gpuiso/node"
)

// TestVocabulary: every sentinel of the Kubernetes packages matches exactly
// one of node's error kinds, as the core's do (the core's own test covers
// its module; this one covers this module).
func TestVocabulary(t *testing.T) {
	kinds := []error{node.ErrNotSupported, node.ErrInvalid, node.ErrExists, node.ErrNotFound, node.ErrInsufficient, node.ErrUnavailable, node.ErrCorrupt}
	for name, err := range map[string]error{
		"deviceplugin.ErrUnknownDevice": deviceplugin.ErrUnknownDevice,
		"deviceplugin.ErrInvalidConfig": deviceplugin.ErrInvalidConfig,
		"deviceplugin.ErrHeld":          deviceplugin.ErrHeld,
		"deviceplugin.ErrRegister":      deviceplugin.ErrRegister,
		"dra.ErrInvalidConfig":          dra.ErrInvalidConfig,
		"dra.ErrUnknownDevice":          dra.ErrUnknownDevice,
		"dra.ErrNotAllocated":           dra.ErrNotAllocated,
		"dra.ErrCorruptCheckpoint":      dra.ErrCorruptCheckpoint,
		"dra.ErrInvalidShare":           dra.ErrInvalidShare,
		"dra.ErrShareClaim":             dra.ErrShareClaim,
		"dra.ErrNoMPS":                  dra.ErrNoMPS,
		"dra.ErrInvalidDeviceConfig":    dra.ErrInvalidDeviceConfig,
		"cluster.ErrStart":              cluster.ErrStart,
		"cluster.ErrNotStarted":         cluster.ErrNotStarted,
	} {
		n := 0
		for _, k := range kinds {
			if errors.Is(err, k) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s matches %d error kinds, want 1", name, n)
		}
	}
}
