package rootfs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/moby/sys/user"

	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/linux"
)

// maxIDFile bounds the /etc/passwd and /etc/group read from an image.
const maxIDFile = 4 << 20

// ResolveUser finds the user and group a container of the image unpacked
// at root runs as, given the image's USER (or a --user flag), as Docker
// does: "" is root; "name" and "uid" take the user's primary group from
// the image's /etc/passwd; a uid not listed there gets group 0; "x:group"
// and "x:gid" set the group, a name from the image's /etc/group. The files
// are read inside root, their symlinks resolved there. A name that is not
// listed, or an id past containerizer.MaxID, is an error matching
// containerizer.ErrInvalidSpec.
func ResolveUser(root, spec string) (containerizer.User, error) {
	r, err := os.OpenRoot(root)
	if err != nil {
		return containerizer.User{}, err
	}
	defer r.Close()
	passwd, err := readIDFile(r, root, "etc/passwd")
	if err != nil {
		return containerizer.User{}, err
	}
	group, err := readIDFile(r, root, "etc/group")
	if err != nil {
		return containerizer.User{}, err
	}
	u, err := user.GetExecUser(spec, &user.ExecUser{}, passwd, group)
	if err != nil {
		return containerizer.User{}, fmt.Errorf("%w: user %q: %w", containerizer.ErrInvalidSpec, spec, err)
	}
	if u.Uid < 0 || u.Uid > containerizer.MaxID || u.Gid < 0 || u.Gid > containerizer.MaxID {
		return containerizer.User{}, fmt.Errorf("%w: user %q: ids go up to %d", containerizer.ErrInvalidSpec, spec, containerizer.MaxID)
	}
	return containerizer.User{UID: uint32(u.Uid), GID: uint32(u.Gid)}, nil
}

// readIDFile reads name in the root r (at root), or returns nil when it is
// missing. Only a regular file is opened: a FIFO or a device by that name is
// refused (ErrInvalidSpec), never opened.
func readIDFile(r *os.Root, root, name string) (io.Reader, error) {
	p, err := resolve(r, name)
	if err != nil {
		return nil, err
	}
	f, err := linux.OpenFileInRoot(root, p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if errors.Is(err, linux.ErrNotRegular) {
		return nil, fmt.Errorf("%w: /%s: %w", containerizer.ErrInvalidSpec, name, err)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxIDFile+1))
	if err != nil {
		return nil, fmt.Errorf("/%s: %w", name, err)
	}
	if len(b) > maxIDFile {
		return nil, fmt.Errorf("%w: /%s is larger than %d bytes", containerizer.ErrInvalidSpec, name, maxIDFile)
	}
	return bytes.NewReader(b), nil
}

// EnsureDir makes dir (the image's WorkingDir, taken from the root) in the
// root file system at root when it is missing, as Docker does, with mode
// 0755; its symlinks are resolved inside root. A dir that exists and is
// not a directory is an error matching containerizer.ErrInvalidSpec.
func EnsureDir(root, dir string) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	p, err := resolve(r, dir)
	if err != nil {
		return fmt.Errorf("working directory %q: %w", dir, err)
	}
	if fi, err := r.Stat(p); err == nil && !fi.IsDir() {
		return fmt.Errorf("%w: working directory %q is not a directory", containerizer.ErrInvalidSpec, dir)
	}
	if err := r.MkdirAll(p, 0o755); err != nil {
		return fmt.Errorf("working directory %q: %w", dir, err)
	}
	return nil
}
