package dra_test

import (
	"testing"

	"github.com/gpuiso/gpuiso/kubernetes/dra"
)

// FuzzParseCheckpoint: any bytes give a checkpoint or an error, never a
// panic, and an accepted checkpoint has a known state.
func FuzzParseCheckpoint(f *testing.F) {
	f.Add([]byte(`{"format":"gpuiso-dra-claim","version":1,"uid":"u","state":"PrepareCompleted","owner":"claim-u","devices":[]}`))
	f.Add([]byte("{"))
	f.Add([]byte(`{"format":"gpuiso-dra-claim","version":1,"checksum":"00"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := dra.ParseCheckpoint(b)
		if err == nil && c.State != dra.StatePrepareStarted && c.State != dra.StatePrepareCompleted {
			t.Errorf("accepted state %q", c.State)
		}
	})
}
