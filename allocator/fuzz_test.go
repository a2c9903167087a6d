package allocator

import (
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/node"
)

func FuzzNormalizeBusID(f *testing.F) {
	for _, s := range []string{"00000000:06:00.0", "0000:AF:1F.7", "3b:00.0", "", ":::", "0:0:0.0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := node.NormalizeBusID(s)
		if err != nil {
			return
		}
		again, err := node.NormalizeBusID(got)
		if err != nil || again != got {
			t.Fatalf("NormalizeBusID(%q) = %q, which normalises to %q, %v", s, got, again, err)
		}
		if got != strings.ToLower(got) {
			t.Fatalf("NormalizeBusID(%q) = %q is not lower case", s, got)
		}
	})
}
