package dra_test

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpuiso/gpuiso/kubernetes/dra"
	"github.com/gpuiso/gpuiso/node"
)

// FuzzHealthTaint: whatever the reason (a monitor's, an operator's), the
// taint is one the API server takes (a label value, a known effect): a
// bad one would keep the whole slice from being published.
func FuzzHealthTaint(f *testing.F) {
	for _, s := range []string{"XID 79", "xid 94", "double-bit ECC error", "GPU is lost", "", "XID 99999999999999999999999", "  maintenance: fan  "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, reason string) {
		taint, ok := dra.HealthTaint(dra.TaintKey(dra.DefaultDriverName), node.Unhealthy(reason))
		if !ok {
			t.Fatal("an unhealthy device without a taint")
		}
		if errs := validation.IsValidLabelValue(taint.Value); len(errs) > 0 || taint.Value == "" {
			t.Errorf("reason %q: value %q: %v", reason, taint.Value, errs)
		}
		if taint.Effect != resourceapi.DeviceTaintEffectNoSchedule && taint.Effect != resourceapi.DeviceTaintEffectNoExecute {
			t.Errorf("reason %q: effect %q", reason, taint.Effect)
		}
		if errs := validation.IsQualifiedName(taint.Key); len(errs) > 0 {
			t.Errorf("key %q: %v", taint.Key, errs)
		}
	})
}
