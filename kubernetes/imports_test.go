// The module's packages use the core through its public API only, so that
// the module builds against a published core, whose internal packages keep
// no promise from one version to the next.
package kubernetes_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const (
	module       = "github.com/gpuiso/gpuiso/kubernetes"
	coreInternal = "github.com/gpuiso/gpuiso/internal"
)

// harness are the packages of this module that may import the core's
// internal packages: the test harness, which the end-to-end suites and the
// tools that build their images link, never the plugin or the library
// packages. It runs clusters as root and uses the core's process, mount
// and signal code (internal/linux) rather than a second copy of it.
var harness = []string{
	module + "/internal/cluster",
}

// imports returns where the non-test files of the module under root
// import the core's internal packages, and where they import a harness
// package, by importing package: "file:line:col: import path".
func imports(t *testing.T, root string) (core, harnessUsers map[string][]string) {
	t.Helper()
	core, harnessUsers = map[string][]string{}, map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root {
				if name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
					return filepath.SkipDir
				}
				if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
					return filepath.SkipDir // another module
				}
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return err
		}
		pkg := path.Join(module, filepath.ToSlash(rel))
		for _, spec := range f.Imports {
			imp, _ := strconv.Unquote(spec.Path.Value)
			where := fset.Position(spec.Pos()).String() + ": " + imp
			if imp == coreInternal || strings.HasPrefix(imp, coreInternal+"/") {
				core[pkg] = append(core[pkg], where)
			}
			if slices.Contains(harness, imp) {
				harnessUsers[pkg] = append(harnessUsers[pkg], where)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return core, harnessUsers
}

// TestNoCoreInternal: no package of the module but the harness imports one
// of the core's internal packages (its tests may: they are not part of
// what an importer builds); only the module's own internal packages (the
// tools that build the suites' images) import the harness, so that the
// plugin and the library packages never link it; and each harness package
// listed still needs its place on the list.
func TestNoCoreInternal(t *testing.T) {
	found, users := imports(t, ".")
	for pkg, where := range users {
		if strings.HasPrefix(pkg, module+"/internal/") {
			continue
		}
		for _, w := range where {
			t.Errorf("%s: %s imports the test harness, which links the core's internal packages", w, pkg)
		}
	}
	for pkg, where := range found {
		if slices.Contains(harness, pkg) {
			continue
		}
		for _, w := range where {
			t.Errorf("%s: %s imports the core's internal packages; use the core's public API (or list a test harness package in harness)", w, pkg)
		}
	}
	for _, pkg := range harness {
		if len(found[pkg]) == 0 {
			t.Errorf("%s is listed in harness but imports no core internal package: take it off the list", pkg)
		}
	}
}

// TestImportsFinds: the walk sees an import of a core internal package or
// of the harness in a package's file, and not in a test file or another
// module.
func TestImportsFinds(t *testing.T) {
	root := t.TempDir()
	write := func(p, src string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("dra/a.go", "package dra\n\nimport (\n\t\"os\"\n\n\t\"github.com/gpuiso/gpuiso/internal/linux\"\n\t\"github.com/gpuiso/gpuiso/node\"\n)\n")
	write("dra/a_test.go", "package dra\n\nimport \"github.com/gpuiso/gpuiso/internal/testing/testenv\"\n")
	write("labels/l.go", "package labels\n\nimport \"github.com/gpuiso/gpuiso/internalx\"\n")
	write("cmd/p/main.go", "package main\n\nimport \"github.com/gpuiso/gpuiso/kubernetes/internal/cluster\"\n")
	write("cmd/p/main_test.go", "package main\n\nimport \"github.com/gpuiso/gpuiso/kubernetes/internal/cluster\"\n")
	write("other/go.mod", "module other\n")
	write("other/o.go", "package other\n\nimport \"github.com/gpuiso/gpuiso/internal/linux\"\n")
	found, users := imports(t, root)
	if len(found) != 1 || len(found[module+"/dra"]) != 1 || !strings.HasSuffix(found[module+"/dra"][0], "github.com/gpuiso/gpuiso/internal/linux") {
		t.Errorf("imports = %q; want dra's import of internal/linux alone", found)
	}
	if len(users) != 1 || len(users[module+"/cmd/p"]) != 1 {
		t.Errorf("harness users = %q; want cmd/p's main.go alone", users)
	}
}
