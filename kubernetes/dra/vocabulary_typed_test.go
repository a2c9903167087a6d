package dra_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/kubernetes/dra"
	"github.com/gpuiso/gpuiso/node"
)

// TestVocabularyTypedErrors: every exported error type of this module
// (found in its sources), built as its package builds it, matches its
// package's sentinel and exactly one of node's error kinds. A new error
// type fails the test until it is listed here.
func TestVocabularyTypedErrors(t *testing.T) {
	kinds := []error{node.ErrNotSupported, node.ErrInvalid, node.ErrExists, node.ErrNotFound, node.ErrInsufficient, node.ErrUnavailable, node.ErrCorrupt}
	typed := map[string]struct {
		err            error
		sentinel, kind error
	}{
		"dra.CheckpointError": {&dra.CheckpointError{Path: "/var/lib/x/claim.json", Err: errors.New("records claim \"y\"")}, dra.ErrCorruptCheckpoint, node.ErrCorrupt},
		"dra.ConfigError":     {&dra.ConfigError{Kind: dra.GPUConfigKind, Field: "sharing.strategy", Err: errors.New("\"x\"")}, dra.ErrInvalidDeviceConfig, node.ErrInvalid},
	}
	var found []string
	err := filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" || (p != ".." && strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || fn.Name.Name != "Error" || len(fn.Type.Params.List) != 0 {
				continue
			}
			recv := fn.Recv.List[0].Type
			if star, ok := recv.(*ast.StarExpr); ok {
				recv = star.X
			}
			if id, ok := recv.(*ast.Ident); ok && id.IsExported() {
				found = append(found, f.Name.Name+"."+id.Name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range found {
		c, ok := typed[name]
		if !ok {
			t.Errorf("%s: an error type this test does not know; add it to the table", name)
			continue
		}
		wrapped := fmt.Errorf("context: %w", c.err)
		n := 0
		for _, k := range kinds {
			if errors.Is(wrapped, k) {
				n++
			}
		}
		if !errors.Is(wrapped, c.sentinel) || !errors.Is(wrapped, c.kind) || n != 1 {
			t.Errorf("%s (%v) matches %d kinds, want its sentinel %v and exactly the kind %v", name, c.err, n, c.sentinel, c.kind)
		}
	}
	if len(found) != len(typed) {
		t.Errorf("found %d error types in the sources, the table has %d", len(found), len(typed))
	}
}
