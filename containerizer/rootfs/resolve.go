package rootfs

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// maxName bounds a path in an image, an entry's name or a link's target:
// the kernel takes no longer path (PATH_MAX).
const maxName = 4096

// maxSteps bounds the look-ups that resolving one path may take, symlinks
// followed included, so that chains of links cannot make it slow.
const maxSteps = 4096

// rootVFS lets securejoin walk a tree through an os.Root: it looks at
// links only inside the root, and os.Root refuses whatever would leave it.
type rootVFS struct {
	r     *os.Root
	steps *int
}

func (v rootVFS) Lstat(name string) (os.FileInfo, error) {
	if *v.steps++; *v.steps > maxSteps {
		return nil, fmt.Errorf("more than %d look-ups to resolve: %w", maxSteps, ErrUnsafe)
	}
	return v.r.Lstat(relName(name))
}

func (v rootVFS) Readlink(name string) (string, error) { return v.r.Readlink(relName(name)) }

// relName turns "/a/b" (or "///a/b") into "a/b", and "/" into ".".
func relName(name string) string {
	n := path.Clean("/" + filepath.ToSlash(name))[1:]
	if n == "" {
		return "."
	}
	return n
}

// resolve returns name, a path in the root, with every symlink in it
// resolved as if the root were "/": an absolute link, or one with "..",
// ends inside the root, as it would for a process chrooted there. The
// result names no symlink but perhaps its last element.
func resolve(r *os.Root, name string) (string, error) {
	steps := 0
	p, err := securejoin.SecureJoinVFS("/", name, rootVFS{r: r, steps: &steps})
	if linux.Loop(err) {
		return "", fmt.Errorf("too many symlinks: %w", ErrUnsafe)
	}
	if err != nil {
		return "", err
	}
	return relName(p), nil
}

// resolveParent resolves the directory of name but not its last element:
// the entry itself may be a symlink to replace.
func resolveParent(r *os.Root, name string) (string, error) {
	dir, base := path.Split(name)
	d, err := resolve(r, dir)
	if err != nil {
		return "", err
	}
	return path.Join(d, base), nil
}

// entryName is a tar entry's name as a path in the root: absolute names
// are taken from the root, as Docker does; a name that climbs above it
// ("../x", "a/../../x"), or one longer than maxName, is refused.
func entryName(name string) (string, bool) {
	if len(name) > maxName {
		return "", false
	}
	n := path.Clean(strings.TrimLeft(name, "/"))
	if n == ".." || strings.HasPrefix(n, "../") {
		return "", false
	}
	if n == "." {
		n = ""
	}
	return n, true
}
