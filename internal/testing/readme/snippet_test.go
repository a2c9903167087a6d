package readme

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGoBlocksCompile: every Go block of the documents compiles, against
// the module as it is (GoSource), so that no documented call can rot: a
// renamed function, a changed signature or a block that names something
// it never had fails here with the document's file and line.
func TestGoBlocksCompile(t *testing.T) {
	var blocks []Block
	for _, doc := range documents(t) {
		text, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		bs, err := GoBlocks(doc, string(text))
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, bs...)
	}
	if len(blocks) == 0 {
		t.Fatal("the documents have no Go block")
	}
	if out, err := compile(t, blocks); err != nil {
		t.Fatalf("the documents' Go blocks do not compile: %v\n%s", err, out)
	}
	t.Logf("%d Go blocks compile", len(blocks))
}

// TestGoBlocksCompileCatches: the check fails a block that calls what the
// module lacks, a block that leaves out what it needs, and a block that
// imports a package under a path other than the one the documents mean,
// each at its document's line; and takes blocks of statements and of
// declarations alike, with results left unused.
func TestGoBlocksCompileCatches(t *testing.T) {
	for _, tt := range []struct {
		name, text, want string
	}{
		{"statements", "x\n```go\nal, err := a.Allocate(ctx, \"t\", allocator.Request{Count: 1})\nif err != nil { return err }\n```\n", ""},
		{"declarations", "```go\nfunc main() {\n\tsim, err := simnode.New(\"pcie8\")\n}\n```\n", ""},
		{"imports", "```go\nimport (\n\t\"github.com/gpuiso/gpuiso/node/simnode\"\n)\n\nsim, _ := simnode.New(\"pcie8\")\n```\n", ""},
		{"gone function", "x\ny\n```go\nal, err := a.AllocateAll(ctx)\n```\n", "f.md:4"},
		{"undeclared", "```go\nc.Recover(ctx)\n```\n", "f.md:2: undefined: c"},
		{"another import path", "```go\nimport \"example.com/allocator\"\n\nallocator.New(inv)\n```\n", "the package the documents call allocator"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			blocks, err := GoBlocks("f.md", tt.text)
			if err != nil || len(blocks) != 1 {
				t.Fatalf("GoBlocks = %+v, %v", blocks, err)
			}
			out, err := compile(t, blocks)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("a good block does not compile: %v\n%s", err, out)
				}
				return
			}
			if err == nil || !strings.Contains(out, tt.want) {
				t.Fatalf("compile = %v, %q; want a failure saying %q", err, out, tt.want)
			}
		})
	}
}

// compile compiles blocks as GoSource makes them, each a package of its
// own laid over the module (go build -overlay), and returns what went
// wrong.
func compile(t *testing.T, blocks []Block) (string, error) {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("no go command: %v", err)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	overlay := map[string]string{}
	add := func(dir, name, src string) {
		f := filepath.Join(tmp, fmt.Sprintf("%d.go", len(overlay)))
		if err := os.WriteFile(f, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		overlay[filepath.Join(abs, dir, name)] = f
	}
	var pkgs []string
	var errs []string
	for i, b := range blocks {
		pkg := fmt.Sprintf("snippet%d", i+1)
		src, err := GoSource(b, pkg)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		dir := filepath.Join("internal", "readme", "_snippets", pkg)
		add(dir, "snippet.go", src)
		add(dir, "given.go", fmt.Sprintf(Given, pkg))
		pkgs = append(pkgs, "./"+filepath.ToSlash(dir))
	}
	if len(errs) > 0 {
		return strings.Join(errs, "\n"), errors.New("blocks that do not parse")
	}
	b, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	ov := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(ov, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", append([]string{"build", "-overlay", ov}, pkgs...)...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
