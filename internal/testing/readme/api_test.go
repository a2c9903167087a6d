package readme

import (
	"bufio"
	"bytes"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestNoInternalTypeInAPI: no exported function, method, variable,
// constant, field or type of a package a user may import names a type of
// an internal package in its signature, which a user could neither name
// nor build. It reads the packages' compiled export data (go list
// -export), so it sees exactly the API the compiler does.
func TestNoInternalTypeInAPI(t *testing.T) {
	exports := exportData(t)
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	var offenders []string
	for _, path := range publicPackages(t) {
		pkg, err := imp.Import(path)
		if err != nil {
			t.Fatalf("import %s: %v", path, err)
		}
		offenders = append(offenders, internalInAPI(pkg)...)
	}
	slices.Sort(offenders)
	for _, o := range offenders {
		t.Errorf("%s", o)
	}
}

// exportData maps every package the module's packages build from to its
// export data file.
func exportData(t *testing.T) map[string]string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("no go command: %v", err)
	}
	cmd := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}} {{.Export}}", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -export: %v\n%s", err, stderr.String())
	}
	m := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		path, file, _ := strings.Cut(sc.Text(), " ")
		m[path] = file
	}
	return m
}

// publicPackages lists the module's packages a user may import: neither
// internal, nor a program, nor an example, nor tests alone.
func publicPackages(t *testing.T) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", "{{.Name}} {{.ImportPath}} {{len .GoFiles}}", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []string
	for l := range strings.Lines(string(out)) {
		f := strings.Fields(l)
		if len(f) != 3 {
			t.Fatalf("go list printed %q", l)
		}
		name, path := f[0], f[1]
		if name == "main" || f[2] == "0" || isInternal(path) || strings.Contains(path+"/", "/examples/") {
			continue
		}
		pkgs = append(pkgs, path)
	}
	if len(pkgs) == 0 {
		t.Fatal("no public package found")
	}
	return pkgs
}

func isInternal(path string) bool {
	return strings.HasPrefix(path, "internal/") || strings.Contains(path, "/internal/") || strings.HasSuffix(path, "/internal")
}

// internalInAPI describes each exported object of pkg whose type names a
// type of an internal package.
func internalInAPI(pkg *types.Package) []string {
	var out []string
	report := func(where string, t types.Type) {
		if n := internalIn(t, map[types.Type]bool{}); n != "" {
			out = append(out, fmt.Sprintf("%s.%s names %s", pkg.Path(), where, n))
		}
	}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch o := obj.(type) {
		case *types.TypeName:
			if o.IsAlias() {
				report(name, o.Type())
				continue
			}
			named, ok := o.Type().(*types.Named)
			if !ok {
				continue
			}
			report(name, named.Underlying())
			for m := range named.Methods() {
				if m.Exported() {
					report(name+"."+m.Name(), m.Type())
				}
			}
		default:
			report(name, obj.Type())
		}
	}
	return out
}

// internalIn returns the first type of an internal package t names, as
// a user of t sees it: exported fields and methods only, named types by
// their name (their own declarations are checked on their own).
func internalIn(t types.Type, seen map[types.Type]bool) string {
	if seen[t] {
		return ""
	}
	seen[t] = true
	switch t := t.(type) {
	case *types.Named:
		if p := t.Obj().Pkg(); p != nil && isInternal(p.Path()) {
			return p.Path() + "." + t.Obj().Name()
		}
		for a := range t.TypeArgs().Types() {
			if n := internalIn(a, seen); n != "" {
				return n
			}
		}
	case *types.Alias:
		if p := t.Obj().Pkg(); p != nil && isInternal(p.Path()) {
			return p.Path() + "." + t.Obj().Name()
		}
		return internalIn(types.Unalias(t), seen)
	case *types.Pointer:
		return internalIn(t.Elem(), seen)
	case *types.Slice:
		return internalIn(t.Elem(), seen)
	case *types.Array:
		return internalIn(t.Elem(), seen)
	case *types.Chan:
		return internalIn(t.Elem(), seen)
	case *types.Map:
		if n := internalIn(t.Key(), seen); n != "" {
			return n
		}
		return internalIn(t.Elem(), seen)
	case *types.Signature:
		for _, tup := range []*types.Tuple{t.Params(), t.Results()} {
			for v := range tup.Variables() {
				if n := internalIn(v.Type(), seen); n != "" {
					return n
				}
			}
		}
	case *types.Struct:
		for f := range t.Fields() {
			if f.Exported() {
				if n := internalIn(f.Type(), seen); n != "" {
					return n
				}
			}
		}
	case *types.Interface:
		for m := range t.Methods() {
			if m.Exported() {
				if n := internalIn(m.Type(), seen); n != "" {
					return n
				}
			}
		}
	}
	return ""
}
