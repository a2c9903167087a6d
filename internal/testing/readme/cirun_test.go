package readme

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testLabel opens the paragraph whose fenced block is the README's test
// command.
const testLabel = "The test command, every test suite (CI runs exactly this, through `.ci/run`):"

// testCommand returns the README's test command: the one line of the
// fenced block that follows testLabel.
func testCommand(t *testing.T, readme string) string {
	t.Helper()
	_, after, ok := strings.Cut(readme, "\n"+testLabel+"\n")
	if !ok {
		t.Fatalf("README.md has no %q paragraph", testLabel)
	}
	lines := strings.Split(strings.TrimLeft(after, "\n"), "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "```") || strings.TrimSpace(lines[2]) != "```" {
		t.Fatalf("README.md's test command is not a block of one line: %q", lines[:min(3, len(lines))])
	}
	return strings.TrimSpace(lines[1])
}

// TestCIRunsTheTestCommand: CI's entry point (.ci/run) runs the README's
// test command as printed, and nothing else: every line of it is a
// comment, a shell option, the cd to the repository root, or exactly that
// command, character for character.
func TestCIRunsTheTestCommand(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	want := testCommand(t, string(readme))
	run, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	for n, line := range strings.Split(string(run), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case line == "set -euo pipefail", line == `cd "$(dirname "$0")/.."`:
		case line == want:
			runs++
		default:
			t.Errorf(".ci/run:%d runs %q, which is not the README's test command %q", n+1, line, want)
		}
	}
	if runs != 1 {
		t.Errorf(".ci/run runs the README's test command %q %d times, want once", want, runs)
	}
}
