package readme

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
)

// Imports are the packages a Go block may use without importing them, by
// the name it uses: the standard ones its text takes for granted and the
// module's. A block that imports a package itself must import it by the
// same path.
var Imports = map[string]string{
	"context":       "context",
	"errors":        "errors",
	"fmt":           "fmt",
	"os":            "os",
	"time":          "time",
	"slog":          "log/slog",
	"nvml":          "github.com/NVIDIA/go-nvml/pkg/nvml",
	"client":        "github.com/moby/moby/client",
	"node":          "github.com/gpuiso/gpuiso/node",
	"nvmlnode":      "github.com/gpuiso/gpuiso/node/nvmlnode",
	"simnode":       "github.com/gpuiso/gpuiso/node/simnode",
	"allocator":     "github.com/gpuiso/gpuiso/allocator",
	"volume":        "github.com/gpuiso/gpuiso/volume",
	"isolator":      "github.com/gpuiso/gpuiso/isolator",
	"cgroups":       "github.com/gpuiso/gpuiso/isolator/cgroups",
	"oci":           "github.com/gpuiso/gpuiso/isolator/oci",
	"cdi":           "github.com/gpuiso/gpuiso/isolator/cdi",
	"mps":           "github.com/gpuiso/gpuiso/isolator/mps",
	"containerizer": "github.com/gpuiso/gpuiso/containerizer",
	"native":        "github.com/gpuiso/gpuiso/containerizer/native",
	"docker":        "github.com/gpuiso/gpuiso/containerizer/docker",
	"record":        "github.com/gpuiso/gpuiso/record",
	"rootfs":        "github.com/gpuiso/gpuiso/containerizer/rootfs",
	"chain":         "github.com/gpuiso/gpuiso/containerizer/chain",
}

// Given is Go source declaring, at package level, what the documents'
// Go blocks take as given from the text around them: the context, the
// node's inventory, the allocator, and so on. A block may declare any of
// them again for itself.
const Given = `package %s

import (
	"context"

	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/volume"
)

var (
	ctx      context.Context      // the caller's
	dir      string               // a directory of the caller's
	inv      *node.Inventory      // the node, discovered
	a        *allocator.Allocator // the node's allocator
	alloc    *allocator.Allocator // the same, by another name
	al       allocator.Allocation // an allocation of a
	plan     *isolator.Plan       // al's isolation plan
	iso      *cgroups.Isolator    // the device isolator
	vols     *volume.Manager      // the driver volume manager
	vol      *volume.Volume       // a driver volume it built
	cli      *client.Client       // a Docker client
	imageEnv []string             // an image's environment
	img      volume.Image         // an image's labels and environment
	driver   volume.Driver        // the host's driver
	gpus     []node.Device        // the GPUs allocated
)
`

// GoSource turns a Go block into the source of a package named pkg that
// compiles exactly when the block does, its lines numbered as the
// document's: a block of declarations (a func main, say) is the file's
// body; any other is the body of a function returning error. The
// packages it uses (Imports) are imported for it and the values it takes
// as given are Given's; a variable it declares and leaves unused (an
// illustration's result) is not an error.
func GoSource(b Block, pkg string) (string, error) {
	text := b.Script
	line := b.Line + 1
	explicit, rest, err := splitImports(b, text)
	if err != nil {
		return "", err
	}
	line += strings.Count(text[:len(text)-len(rest)], "\n")
	directive := fmt.Sprintf("//line %s:%d\n", b.File, line)
	var src string
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "", "package p\n"+rest, 0)
	file := err == nil && len(f.Decls) > 0
	if file {
		src = directive + rest
	} else {
		src = "func snippet() error {\n" + directive + rest + "\nreturn nil\n}\n"
	}
	f, err = parser.ParseFile(fset, b.Name(), "package p\n"+src, 0)
	if err != nil {
		return "", fmt.Errorf("%s: %w", b.Name(), err)
	}
	// Use what each function declares at its top level, before its
	// closing brace or the wrapper's return (on its line, so no line of
	// the block moves).
	type insert struct {
		at   int
		text string
	}
	var inserts []insert
	base := fset.File(f.Pos()).Base() + len("package p\n")
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		var uses strings.Builder
		for _, name := range declared(fn.Body) {
			uses.WriteString("_ = " + name + "; ")
		}
		at := fn.Body.Rbrace
		if !file && len(fn.Body.List) > 0 {
			at = fn.Body.List[len(fn.Body.List)-1].Pos() // before the wrapper's return
		}
		if uses.Len() > 0 {
			inserts = append(inserts, insert{int(at) - base, uses.String()})
		}
	}
	slices.SortFunc(inserts, func(x, y insert) int { return y.at - x.at })
	for _, in := range inserts {
		src = src[:in.at] + in.text + src[in.at:]
	}
	// Import what the block names and does not declare itself.
	local := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if n.Tok == token.DEFINE {
				for _, e := range n.Lhs {
					if id, ok := e.(*ast.Ident); ok {
						local[id.Name] = true
					}
				}
			}
		case *ast.ValueSpec:
			for _, id := range n.Names {
				local[id.Name] = true
			}
		case *ast.Field:
			for _, id := range n.Names {
				local[id.Name] = true
			}
		}
		return true
	})
	used := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && !local[id.Name] && Imports[id.Name] != "" {
				used[id.Name] = true
			}
		}
		return true
	})
	for name := range explicit {
		used[name] = true
	}
	var imports strings.Builder
	for _, name := range slices.Sorted(maps.Keys(used)) {
		imports.WriteString("\t" + name + " " + strconv.Quote(Imports[name]) + "\n")
	}
	return "package " + pkg + "\n\nimport (\n" + imports.String() + ")\n\n" + src, nil
}

// splitImports takes a block's leading import declarations off its text,
// checking that each imports a package of Imports by its path, and
// returns the names they import and the rest of the text.
func splitImports(b Block, text string) (map[string]bool, string, error) {
	names := map[string]bool{}
	if !strings.HasPrefix(strings.TrimSpace(text), "import") {
		return names, text, nil
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, b.Name(), "package p\n"+text, parser.ImportsOnly)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", b.Name(), err)
	}
	var end token.Pos
	for _, d := range f.Decls {
		end = d.End()
	}
	for _, spec := range f.Imports {
		p, _ := strconv.Unquote(spec.Path.Value)
		name := path.Base(p)
		if spec.Name != nil {
			name = spec.Name.Name
		}
		if Imports[name] != p {
			return nil, "", fmt.Errorf("%s: import %s %q: the package the documents call %s is %q", b.Name(), name, p, name, Imports[name])
		}
		names[name] = true
	}
	off := fset.Position(end).Offset - len("package p\n")
	return names, text[off:], nil
}

// declared lists the variables a function body declares at its top
// level.
func declared(body *ast.BlockStmt) []string {
	var out []string
	add := func(id *ast.Ident) {
		if id.Name != "_" && !slices.Contains(out, id.Name) {
			out = append(out, id.Name)
		}
	}
	for _, st := range body.List {
		switch st := st.(type) {
		case *ast.AssignStmt:
			if st.Tok == token.DEFINE {
				for _, e := range st.Lhs {
					if id, ok := e.(*ast.Ident); ok {
						add(id)
					}
				}
			}
		case *ast.DeclStmt:
			if g, ok := st.Decl.(*ast.GenDecl); ok && g.Tok == token.VAR {
				for _, s := range g.Specs {
					for _, id := range s.(*ast.ValueSpec).Names {
						add(id)
					}
				}
			}
		}
	}
	return out
}
