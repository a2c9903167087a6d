package volume

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// maxSymlinks bounds the symlinks followed resolving one path, as the kernel
// does (40).
const maxSymlinks = 40

// resolve follows every symlink of p (an absolute path as the driver root
// sees it) inside the tree rooted at root, the way the kernel would inside a
// chroot: absolute targets start again at root. A ".." that would climb
// above root escapes it: the path is refused with an error matching
// ErrEscapesRoot. It returns the resolved path, absolute and relative to
// root.
func resolve(root, p string) (string, error) {
	if !path.IsAbs(p) {
		return "", fmt.Errorf("resolve %q: not an absolute path: %w", p, ErrInvalidName)
	}
	todo := strings.Split(strings.TrimPrefix(path.Clean(p), "/"), "/")
	done := "/"
	hops := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if done == "/" {
				return "", &fs.PathError{Op: "resolve", Path: p, Err: ErrEscapesRoot}
			}
			done = path.Dir(done)
			continue
		}
		next := path.Join(done, c)
		host := filepath.Join(root, filepath.FromSlash(next))
		fi, err := os.Lstat(host)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			done = next
			continue
		}
		if hops++; hops > maxSymlinks {
			return "", &fs.PathError{Op: "resolve", Path: p, Err: fmt.Errorf("more than %d symlinks", maxSymlinks)}
		}
		target, err := os.Readlink(host)
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			done = "/"
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	return done, nil
}

// validName reports whether s can name one entry of a directory: not empty,
// not "." or "..", without "/", NUL or "..".
func validName(s string) bool {
	return s != "" && s != "." && !strings.ContainsAny(s, "/\x00") && !strings.Contains(s, "..")
}
