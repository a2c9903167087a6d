package dra_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuiso/gpuiso/kubernetes/dra"
)

// FuzzParseCheckpoint: any bytes give a checkpoint or an error, never a
// panic, and an accepted checkpoint has a known state and a share only on
// its one device.
func FuzzParseCheckpoint(f *testing.F) {
	f.Add([]byte(`{"format":"gpuiso-dra-claim","version":1,"uid":"u","state":"PrepareCompleted","owner":"claim-u","devices":[]}`))
	f.Add([]byte("{"))
	f.Add([]byte(`{"format":"gpuiso-dra-claim","version":1,"checksum":"00"}`))
	f.Add([]byte(`{"format":"gpuiso-dra-claim","version":2,"uid":"u","state":"PrepareCompleted","owner":"claim-u","devices":[{"device":"share-0","uuid":"GPU-x","shareID":"s"}],"share":{"memoryBytes":1073741824}}`))
	f.Add([]byte(`{"format":"gpuiso-dra-claim","version":3,"key":"u","phase":"started","data":{"owner":"claim-u","devices":null}}`))
	for _, dir := range []string{"checkpoints-v2", "checkpoints-v3"} {
		files, _ := filepath.Glob(filepath.Join("testdata", dir, "*.json"))
		for _, p := range files {
			if b, err := os.ReadFile(p); err == nil {
				f.Add(b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := dra.ParseCheckpoint(b)
		if err == nil && c.State != dra.StatePrepareStarted && c.State != dra.StatePrepareCompleted {
			t.Errorf("accepted state %q", c.State)
		}
		if err == nil && c.Share != nil && (len(c.Devices) != 1 || c.Share.MemoryBytes == 0) {
			t.Errorf("accepted share %+v on %d devices", c.Share, len(c.Devices))
		}
	})
}
