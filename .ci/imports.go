// Command imports checks the import blocks of Go files: the standard
// library first, then other modules, then gpuiso's own packages last, each
// kind in one group of its own, groups apart by a blank line. A block that
// passes is one `goimports -local github.com/gpuiso/gpuiso` leaves alone;
// this check also refuses a kind split over two groups, which goimports
// lets be. An import "C" of a cgo file stands apart and is not looked at.
//
//	git ls-files '*.go' | go run .ci/imports.go [-w]
//
// (the file names come on standard input, one a line: go run would take
// them for its own sources).
//
// It prints each file whose imports break the rule and exits 1. With -w it
// rewrites such a file's block instead, where no comment sits in it (a
// commented block is reported for a person to fix).
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strconv"
	"strings"
)

const local = "github.com/gpuiso/gpuiso"

// kinds of import, in the order their groups come.
const (
	std = iota
	other
	own
)

func kindOf(path string) int {
	switch {
	case path == local || strings.HasPrefix(path, local+"/"):
		return own
	case !strings.Contains(strings.SplitN(path, "/", 2)[0], "."):
		return std
	}
	return other
}

func main() {
	write := flag.Bool("w", false, "rewrite the import blocks that break the rule (those without comments)")
	flag.Parse()
	var names []string
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if n := strings.TrimSpace(sc.Text()); n != "" {
			names = append(names, n)
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	bad := false
	for _, name := range names {
		msg, err := check(name, *write)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			bad = true
			continue
		}
		if msg != "" {
			fmt.Println(msg)
			bad = true
		}
	}
	if bad {
		if !*write {
			fmt.Fprintln(os.Stderr, "imports: group them as standard library, other modules, then "+local+"/... last (echo FILE | go run .ci/imports.go -w fixes a block without comments)")
		}
		os.Exit(1)
	}
}

// check returns why name's imports break the rule ("" when they do not),
// after rewriting them when write is set and it can.
func check(name string, write bool) (string, error) {
	src, err := os.ReadFile(name)
	if err != nil {
		return "", err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, parser.ImportsOnly|parser.ParseComments)
	if err != nil {
		return "", err
	}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.IMPORT || len(g.Specs) == 0 {
			continue
		}
		if len(g.Specs) == 1 && g.Specs[0].(*ast.ImportSpec).Path.Value == `"C"` {
			continue
		}
		why := breaks(fset, g)
		if why == "" {
			continue
		}
		if !write {
			return fmt.Sprintf("%s:%d: %s", name, fset.Position(g.Pos()).Line, why), nil
		}
		if commented(fset, f, g) || !g.Lparen.IsValid() {
			return fmt.Sprintf("%s:%d: %s (a comment in the block: fix it by hand)", name, fset.Position(g.Pos()).Line, why), nil
		}
		out, err := rewrite(fset, src, g)
		if err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		if err := os.WriteFile(name, out, 0o644); err != nil {
			return "", err
		}
		// Once rewritten, the file's other blocks (if any) are checked on
		// the next run.
		return "", nil
	}
	return "", nil
}

// breaks says what is wrong with one import declaration, "" if nothing.
func breaks(fset *token.FileSet, g *ast.GenDecl) string {
	groupKinds := [][]int{}
	last := -1
	for _, s := range g.Specs {
		spec := s.(*ast.ImportSpec)
		p, _ := strconv.Unquote(spec.Path.Value)
		line := fset.Position(spec.Pos()).Line
		if spec.Doc != nil {
			line = fset.Position(spec.Doc.Pos()).Line
		}
		if last < 0 || line > last+1 {
			groupKinds = append(groupKinds, nil)
		}
		last = fset.Position(spec.End()).Line
		groupKinds[len(groupKinds)-1] = append(groupKinds[len(groupKinds)-1], kindOf(p))
	}
	names := [...]string{"standard library", "other modules", "gpuiso's own"}
	seen := map[int]bool{}
	prev := -1
	for _, kinds := range groupKinds {
		k := kinds[0]
		for _, o := range kinds[1:] {
			if o != k {
				return fmt.Sprintf("one group mixes %s and %s imports", names[k], names[o])
			}
		}
		if seen[k] {
			return fmt.Sprintf("%s imports are split over several groups", names[k])
		}
		if k < prev {
			return fmt.Sprintf("%s imports come after %s ones", names[k], names[prev])
		}
		seen[k], prev = true, k
	}
	return ""
}

// commented tells whether a comment sits inside g.
func commented(fset *token.FileSet, f *ast.File, g *ast.GenDecl) bool {
	for _, c := range f.Comments {
		if c.Pos() > g.Lparen && c.End() < g.Rparen {
			return true
		}
	}
	return false
}

// rewrite returns src with g's block replaced by its imports regrouped.
func rewrite(fset *token.FileSet, src []byte, g *ast.GenDecl) ([]byte, error) {
	var groups [3][]string
	for _, s := range g.Specs {
		spec := s.(*ast.ImportSpec)
		p, _ := strconv.Unquote(spec.Path.Value)
		line := spec.Path.Value
		if spec.Name != nil {
			line = spec.Name.Name + " " + line
		}
		groups[kindOf(p)] = append(groups[kindOf(p)], line)
	}
	var b bytes.Buffer
	b.WriteString("(\n")
	first := true
	for _, lines := range groups {
		if len(lines) == 0 {
			continue
		}
		if !first {
			b.WriteString("\n")
		}
		first = false
		slices.SortFunc(lines, func(a, c string) int { return strings.Compare(pathOf(a), pathOf(c)) })
		for _, l := range lines {
			b.WriteString("\t" + l + "\n")
		}
	}
	b.WriteString(")")
	start := fset.Position(g.Lparen).Offset
	end := fset.Position(g.Rparen).Offset + 1
	out := append(append(append([]byte{}, src[:start]...), b.Bytes()...), src[end:]...)
	return format.Source(out)
}

func pathOf(line string) string {
	if i := strings.IndexByte(line, '"'); i >= 0 {
		return line[i:]
	}
	return line
}
