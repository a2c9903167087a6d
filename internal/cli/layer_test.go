package cli

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// layerAllowed tells whether the package may import path: the standard
// library, node and its packages, and internal/linux, which sit below it.
// The library's packages above node (allocator, volume, isolator,
// containerizer) serve the programs beside this package, not through it.
func layerAllowed(path string) bool {
	const mod = "github.com/gpuiso/gpuiso/"
	switch {
	case !strings.Contains(strings.SplitN(path, "/", 2)[0], "."):
		return true // the standard library
	case path == mod+"node" || strings.HasPrefix(path, mod+"node/"):
		return true
	case path == mod+"internal/linux":
		return true
	}
	return false
}

// TestLayer: the package's own files import nothing above node (tests may:
// they are not linked into the programs).
func TestLayer(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	n := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		n++
		for _, spec := range f.Imports {
			path, _ := strconv.Unquote(spec.Path.Value)
			if !layerAllowed(path) {
				t.Errorf("%s imports %s: internal/cli imports only node's packages, internal/linux and the standard library", fset.Position(spec.Pos()), path)
			}
		}
	}
	if n == 0 {
		t.Fatal("no source files found")
	}
}

func TestLayerAllowed(t *testing.T) {
	for path, want := range map[string]bool{
		"os":                                                true,
		"github.com/gpuiso/gpuiso/node":                     true,
		"github.com/gpuiso/gpuiso/node/simnode":             true,
		"github.com/gpuiso/gpuiso/internal/linux":           true,
		"github.com/gpuiso/gpuiso/volume":                   false,
		"github.com/gpuiso/gpuiso/allocator":                false,
		"github.com/gpuiso/gpuiso/nodes":                    false,
		"github.com/gpuiso/gpuiso/internal/testing/testenv": false,
		"github.com/NVIDIA/go-nvml/pkg/nvml":                false,
	} {
		if got := layerAllowed(path); got != want {
			t.Errorf("layerAllowed(%q) = %v; want %v", path, got, want)
		}
	}
}
