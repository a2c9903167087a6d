package readme

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// root is the repository root, from this package's directory.
const root = "../../.."

// documents are the files whose runnable blocks run, in order.
func documents(t *testing.T) []string {
	t.Helper()
	docs := []string{"README.md", "examples/README.md"}
	more, err := filepath.Glob(filepath.Join(root, "examples", "*", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(more)
	for _, m := range more {
		rel, err := filepath.Rel(root, m)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, filepath.ToSlash(rel))
	}
	return docs
}

func TestBlocks(t *testing.T) {
	tests := []struct {
		name    string
		text    string
		want    []Block
		wantErr string
	}{
		{"none", "# title\n\n```sh\nrm -rf /\n```\n", nil, ""},
		{"one", "x\n```sh runnable\necho hi\n```\n", []Block{{File: "f", Line: 2, Script: "echo hi\n", Timeout: DefaultTimeout}}, ""},
		{"needs and timeout", "```sh runnable docker podman timeout=1m\na\nb\n```\n",
			[]Block{{File: "f", Line: 1, Script: "a\nb\n", Needs: []string{"docker", "podman"}, Timeout: time.Minute}}, ""},
		{"fence in other block", "```go\nx := \"```sh runnable\"\n```\n```sh runnable\nok\n```\n",
			[]Block{{File: "f", Line: 4, Script: "ok\n", Timeout: DefaultTimeout}}, ""},
		{"console is not runnable", "```console\n$ ls\n```\n", nil, ""},
		{"unknown need", "```sh runnable gpu\nx\n```\n", nil, `needs "gpu"`},
		{"bad timeout", "```sh runnable timeout=soon\nx\n```\n", nil, "timeout=soon"},
		{"not shell", "```go runnable\nx\n```\n", nil, "want sh or bash"},
		{"unclosed", "```sh runnable\nx\n", nil, "not closed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Blocks("f", tt.text)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want one with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d blocks %+v, want %+v", len(got), got, tt.want)
			}
			for i := range got {
				g, w := got[i], tt.want[i]
				if g.File != w.File || g.Line != w.Line || g.Script != w.Script || g.Timeout != w.Timeout || !slices.Equal(g.Needs, w.Needs) {
					t.Errorf("block %d = %+v, want %+v", i, g, w)
				}
			}
		})
	}
}

// TestDocumentsParse: every document's runnable blocks are well formed, and
// the README has some (so that the runner cannot pass by finding none).
func TestDocumentsParse(t *testing.T) {
	total := 0
	for _, doc := range documents(t) {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		blocks, err := Blocks(doc, string(b))
		if err != nil {
			t.Fatal(err)
		}
		total += len(blocks)
		if doc == "README.md" && len(blocks) == 0 {
			t.Errorf("README.md has no runnable block")
		}
	}
	t.Logf("%d runnable blocks", total)
}

// compilerWarning matches what a C compiler prints for a warning.
var compilerWarning = regexp.MustCompile(`(?m)warning: |\[-W[a-z-]+\]`)

// TestRunnableBlocks runs every runnable block of the documents, in order,
// as root on the provisioned host, without CGO_CFLAGS in its environment:
// each must exit 0 within its timeout and print no compiler warning.
func TestRunnableBlocks(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatalf("no bash: %v", err)
	}
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "CGO_CFLAGS=") {
			env = append(env, e)
		}
	}
	for _, doc := range documents(t) {
		text, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		blocks, err := Blocks(doc, string(text))
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range blocks {
			t.Run(b.Name(), func(t *testing.T) {
				for _, n := range b.Needs {
					switch n {
					case "docker":
						testenv.RequireDocker(t)
					case "podman":
						testenv.RequirePodman(t)
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), b.Timeout)
				defer cancel()
				cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", b.Script)
				cmd.Dir = root
				cmd.Env = env
				cmd.WaitDelay = 10 * time.Second
				var out bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &out
				err := cmd.Run()
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					t.Fatalf("%s ran past its timeout of %v:\n%s\noutput:\n%s", b.Name(), b.Timeout, b.Script, out.String())
				}
				if err != nil {
					t.Fatalf("%s: %v:\n%s\noutput:\n%s", b.Name(), err, b.Script, out.String())
				}
				if loc := compilerWarning.FindIndex(out.Bytes()); loc != nil {
					t.Fatalf("%s printed a compiler warning:\n%s", b.Name(), out.String())
				}
				t.Logf("%s:\n%s", b.Name(), out.String())
			})
		}
	}
}
