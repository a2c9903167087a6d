package e2e

import (
	"strings"
	"testing"
)

// TestChartNotes renders the notes `helm install` prints, without a
// cluster (a client-side dry run): they offer resources.limits of the
// extended resource through DRA exactly when the GPU class serves it, not
// when the device plugin serves the same name.
func TestChartNotes(t *testing.T) {
	h := requireHelm(t, nil)
	const offer = "or ask for resources.limits[nvidia.com/gpu]"
	for _, tc := range []struct {
		name  string
		set   []string
		offer bool
	}{
		{"defaults", nil, true},
		{"device plugin of the same name", []string{"--set", "devicePlugin.enabled=true"}, false},
		{"device plugin of another name", []string{"--set", "devicePlugin.enabled=true", "--set", "devicePlugin.resourceName=example.com/gpu"}, true},
		{"no extended resource", []string{"--set", "deviceClasses.extendedResourceName="}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := h.run(t.Context(), append([]string{"install", release, chartDir, "--dry-run=client"}, tc.set...)...)
			if err != nil {
				t.Fatal(err)
			}
			_, notes, ok := strings.Cut(out, "NOTES:")
			if !ok {
				t.Fatalf("no NOTES in:\n%s", out)
			}
			if got := strings.Contains(notes, offer); got != tc.offer {
				t.Errorf("notes offer %q: %v, want %v:\n%s", offer, got, tc.offer, notes)
			}
		})
	}
}
