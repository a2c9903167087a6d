package linux

import (
	"bufio"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
)

// ParseMountPoints reads mountinfo (the format of /proc/self/mountinfo) and
// returns the mount points at or below under, in the order the kernel lists
// them (parents before their children).
func ParseMountPoints(r io.Reader, under string) ([]string, error) {
	under = filepath.Clean(under)
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			return nil, fmt.Errorf("mountinfo line %d: %d fields, want at least 5", n, len(f))
		}
		p, err := unescapeMountPath(f[4])
		if err != nil {
			return nil, fmt.Errorf("mountinfo line %d: %w", n, err)
		}
		if p == under || under == "/" || strings.HasPrefix(p, under+"/") {
			out = append(out, p)
		}
	}
	return out, sc.Err()
}

// unescapeMountPath undoes the kernel's octal escapes (\040 for a space)
// in a mountinfo path.
func unescapeMountPath(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' {
			if i+4 > len(s) {
				return "", fmt.Errorf("path %q: bad escape", s)
			}
			v, err := strconv.ParseUint(s[i+1:i+4], 8, 8)
			if err != nil {
				return "", fmt.Errorf("path %q: bad escape", s)
			}
			b.WriteByte(byte(v))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String(), nil
}
