package dra_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpuiso/gpuiso/kubernetes/dra"
)

// TestSweepMetadata: the device metadata files and CDI specs of claims no
// longer prepared (as a release before device metadata leaves them when
// it unprepares claims this one prepared) go; those of prepared claims,
// and every other file (the claims' own specs), stay. A checkpoint that cannot be read keeps its
// claim's spec and every metadata directory.
func TestSweepMetadata(t *testing.T) {
	tests := []struct {
		name        string
		corrupt     bool
		wantRemoved []string
		wantLeft    []string
	}{
		{
			name:        "claims unprepared by another release",
			wantRemoved: []string{"gone-1", "gone-2"},
			wantLeft: []string{"cdi/gpu.gpuiso.io-claim_alloc-claim-kept.json", "cdi/gpu.gpuiso.io_metadata_kept_r0.json", "cdi/other.io_metadata_gone-1_r0.json", "cdi/readme.txt",
				"data/dra-device-metadata/ns_claim-kept/r0/metadata.json", "data/serialize.lock"},
		},
		{
			name:        "a checkpoint unread",
			corrupt:     true,
			wantRemoved: []string{"gone-1", "gone-2"},
			wantLeft: []string{"cdi/gpu.gpuiso.io-claim_alloc-claim-kept.json", "cdi/gpu.gpuiso.io_metadata_bad_r0.json", "cdi/gpu.gpuiso.io_metadata_kept_r0.json",
				"cdi/other.io_metadata_gone-1_r0.json", "cdi/readme.txt",
				"data/dra-device-metadata/ns_claim-gone-1/r0/metadata.json", "data/dra-device-metadata/ns_claim-gone-2/r0/metadata.json",
				"data/dra-device-metadata/ns_claim-kept/r0/metadata.json", "data/serialize.lock"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, "dgx1-volta")
			d, _ := e.driver(t)
			if _, err := d.Prepare(t.Context(), claim("kept", "gpu-0")); err != nil {
				t.Fatal(err)
			}
			data := filepath.Join(filepath.Dir(e.cdiDir), "data")
			files := []string{"data/serialize.lock", "cdi/readme.txt", "cdi/other.io_metadata_gone-1_r0.json"}
			for _, uid := range []string{"kept", "gone-1", "gone-2"} {
				files = append(files, "cdi/gpu.gpuiso.io_metadata_"+uid+"_r0.json", "data/"+dra.MetadataDir+"/ns_claim-"+uid+"/r0/metadata.json")
			}
			if tt.corrupt {
				files = append(files, "cdi/gpu.gpuiso.io_metadata_bad_r0.json")
				if err := os.WriteFile(filepath.Join(e.stateDir, "bad.json"), []byte("{"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			root := filepath.Dir(e.cdiDir)
			for _, f := range files {
				p := filepath.Join(root, f)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte("{}"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			removed, err := d.SweepMetadata(data)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(removed, tt.wantRemoved) {
				t.Errorf("removed the metadata of %v, want %v", removed, tt.wantRemoved)
			}
			var left []string
			for _, dir := range []string{"cdi", "data"} {
				filepath.WalkDir(filepath.Join(root, dir), func(p string, de os.DirEntry, err error) error {
					if err == nil && !de.IsDir() {
						rel, _ := filepath.Rel(root, p)
						left = append(left, rel)
					}
					return nil
				})
			}
			if !slices.Equal(left, tt.wantLeft) {
				t.Errorf("left:\n%v\nwant:\n%v", left, tt.wantLeft)
			}
		})
	}
}

// TestSweepMetadataNothing: without a metadata directory or a CDI
// directory there is nothing to sweep, and no error.
func TestSweepMetadataNothing(t *testing.T) {
	e := newEnv(t, "dgx1-volta")
	d, _ := e.driver(t)
	if err := os.Remove(e.cdiDir); err != nil {
		t.Fatal(err)
	}
	removed, err := d.SweepMetadata(filepath.Join(t.TempDir(), "none"))
	if err != nil || removed != nil {
		t.Errorf("SweepMetadata = %v, %v; want nothing", removed, err)
	}
}
