package readme

import (
	"bufio"
	"fmt"
	"strings"
	"time"
)

// DefaultTimeout bounds a block that names no timeout.
const DefaultTimeout = 5 * time.Minute

// Block is one runnable shell block of a document.
type Block struct {
	File    string        // the document, relative to the repository root
	Line    int           // the line of its opening fence
	Script  string        // its text
	Needs   []string      // what it needs besides root: "docker", "podman"
	Timeout time.Duration // how long it may run
}

// Name identifies the block in test names: "README.md:42".
func (b Block) Name() string { return fmt.Sprintf("%s:%d", b.File, b.Line) }

// Blocks returns the runnable blocks of the document text, named file. A
// block marked runnable with a word it does not know, a bad timeout or no
// closing fence is an error.
func Blocks(file, text string) ([]Block, error) {
	var out []Block
	var cur *Block
	var body strings.Builder
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if cur != nil {
			if trimmed == "```" {
				cur.Script = body.String()
				out = append(out, *cur)
				cur = nil
				continue
			}
			body.WriteString(line + "\n")
			continue
		}
		info, ok := strings.CutPrefix(trimmed, "```")
		if !ok {
			continue
		}
		words := strings.Fields(info)
		if len(words) < 2 || words[1] != "runnable" {
			// Any other fenced block: skip to its end.
			for sc.Scan() {
				n++
				if strings.TrimSpace(sc.Text()) == "```" {
					break
				}
			}
			continue
		}
		if words[0] != "sh" && words[0] != "bash" {
			return nil, fmt.Errorf("%s:%d: runnable block of %q: want sh or bash", file, n, words[0])
		}
		b := Block{File: file, Line: n, Timeout: DefaultTimeout}
		for _, w := range words[2:] {
			switch {
			case w == "docker" || w == "podman":
				b.Needs = append(b.Needs, w)
			case strings.HasPrefix(w, "timeout="):
				d, err := time.ParseDuration(strings.TrimPrefix(w, "timeout="))
				if err != nil || d <= 0 {
					return nil, fmt.Errorf("%s:%d: %s: want a positive duration", file, n, w)
				}
				b.Timeout = d
			default:
				return nil, fmt.Errorf("%s:%d: runnable block needs %q: want docker, podman or timeout=D", file, n, w)
			}
		}
		cur = &b
		body.Reset()
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: runnable block not closed", file, cur.Line)
	}
	return out, nil
}

// GoBlocks returns the Go blocks of the document text, named file: every
// block fenced with the info string "go". Each is compiled (see package
// doc). A block without a closing fence is an error.
func GoBlocks(file, text string) ([]Block, error) {
	var out []Block
	var cur *Block
	var body strings.Builder
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if cur != nil {
			if trimmed == "```" {
				cur.Script = body.String()
				out = append(out, *cur)
				cur = nil
				continue
			}
			body.WriteString(line + "\n")
			continue
		}
		info, ok := strings.CutPrefix(trimmed, "```")
		if !ok {
			continue
		}
		if words := strings.Fields(info); len(words) == 0 || words[0] != "go" {
			for sc.Scan() { // any other fenced block: skip to its end
				n++
				if strings.TrimSpace(sc.Text()) == "```" {
					break
				}
			}
			continue
		}
		cur = &Block{File: file, Line: n}
		body.Reset()
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: go block not closed", file, cur.Line)
	}
	return out, nil
}
