package simnode

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

var (
	// ErrInvalidSpec: a topology description is malformed.
	ErrInvalidSpec = node.Sentinel(node.ErrInvalid, "invalid topology description")
	// ErrUnknownTopology: no shipped topology has that name.
	ErrUnknownTopology = node.Sentinel(node.ErrNotFound, "unknown topology")
	// ErrNoSuchGPU: an index names no GPU of the node.
	ErrNoSuchGPU = node.Sentinel(node.ErrNotFound, "no such GPU")
	// ErrNoSuchMIGDevice: no MIG device of the GPU has those instance ids.
	ErrNoSuchMIGDevice = node.Sentinel(node.ErrNotFound, "no such MIG device")
	// ErrRealDev: the simulated host's device nodes would land in the
	// host's real /dev, which the simulation never writes to.
	ErrRealDev = node.Sentinel(node.ErrInvalid, "refusing to create simulated device nodes in the real /dev")
	// ErrHostPath: a simulated host tree would be made (or removed) in the
	// host's own root directory or in its /dev, /proc or /sys.
	ErrHostPath = node.Sentinel(node.ErrInvalid, "refusing a simulated host tree in the host's own directories")
	// ErrNotOwned: a directory given for a simulated host tree holds files
	// gpuiso did not make (it is neither empty nor marked as gpuiso's).
	ErrNotOwned = node.Sentinel(node.ErrExists, "directory holds files gpuiso did not make")
	// ErrInvalidVersion: a driver version is not digits and dots.
	ErrInvalidVersion = node.Sentinel(node.ErrInvalid, "invalid driver version")
)

// UnknownTopologyError names a topology that is not shipped, and those that are.
type UnknownTopologyError struct {
	Name  string
	Known []string
}

func (e *UnknownTopologyError) Error() string {
	return fmt.Sprintf("unknown topology %q (shipped: %s)", e.Name, strings.Join(e.Known, ", "))
}

// Is makes errors.Is(err, ErrUnknownTopology) and errors.Is(err,
// node.ErrNotFound) hold.
func (e *UnknownTopologyError) Is(target error) bool { return errors.Is(ErrUnknownTopology, target) }

// HostPathError names a directory that is, or resolves to, the host's own
// root directory or a place in its /dev, /proc or /sys, where a simulated
// host tree is never made or removed.
type HostPathError struct {
	Dir      string // as given
	Resolved string // absolute, symlinks resolved
}

func (e *HostPathError) Error() string {
	at := e.Dir
	if filepath.Clean(e.Dir) != e.Resolved {
		at = fmt.Sprintf("%s (%s)", e.Dir, e.Resolved)
	}
	place := "is the host's root directory"
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		if e.Resolved == d || strings.HasPrefix(e.Resolved, d+"/") {
			place = "is in the host's own " + d
		}
	}
	return fmt.Sprintf("%s %s: refusing to make or remove a simulated host tree there", at, place)
}

// Is makes errors.Is(err, ErrHostPath) and errors.Is(err, node.ErrInvalid)
// hold, and errors.Is(err, ErrRealDev) where the tree's device nodes would
// be the host's (its root directory or /dev).
func (e *HostPathError) Is(target error) bool {
	dev := e.Resolved == "/" || e.Resolved == "/dev" || strings.HasPrefix(e.Resolved, "/dev/")
	return errors.Is(ErrHostPath, target) || (dev && errors.Is(ErrRealDev, target))
}

// NotOwnedError names a directory, given for a simulated host tree, that
// is neither new, nor empty, nor a tree gpuiso made: nothing is made or
// removed in it.
type NotOwnedError struct {
	Dir     string
	Entries []string // what it holds, sorted
}

func (e *NotOwnedError) Error() string {
	held := e.Entries
	more := ""
	if len(held) > 3 {
		held, more = held[:3], fmt.Sprintf(" and %d more", len(e.Entries)-3)
	}
	return fmt.Sprintf("%s holds %s%s, not made by gpuiso: refusing to make or remove a simulated host tree there (give a new or empty directory)",
		e.Dir, strings.Join(held, ", "), more)
}

// Is makes errors.Is(err, ErrNotOwned) and errors.Is(err, node.ErrExists)
// hold.
func (e *NotOwnedError) Is(target error) bool { return errors.Is(ErrNotOwned, target) }

var (
	// ErrTreeExists: MakeHost was given a directory that already holds a
	// simulated host tree's dev, proc or sys (OpenHost reuses such a tree).
	ErrTreeExists = node.Sentinel(node.ErrExists, "simulated host tree already exists")
	// ErrUntrusted: a directory given for a simulated host tree, or one of
	// its parents, is owned or writable by another user, or the tree in it
	// holds what gpuiso never makes (a link, a device node of another
	// driver): that user could point the node's GPUs at any device.
	ErrUntrusted = node.Sentinel(node.ErrInvalid, "simulated host tree not trusted")
)

// ExistsError names the part of a simulated host tree that MakeHost found
// already made in its directory: nothing was made or removed.
type ExistsError struct {
	Dir  string // the tree's directory
	Path string // what is already there
}

func (e *ExistsError) Error() string {
	return fmt.Sprintf("%s already exists: %s holds a simulated host tree (reuse it with OpenHost, or give a new or empty directory)", e.Path, e.Dir)
}

// Is makes errors.Is(err, ErrTreeExists), errors.Is(err, node.ErrExists)
// and errors.Is(err, fs.ErrExist) hold.
func (e *ExistsError) Is(target error) bool {
	return errors.Is(ErrTreeExists, target) || target == fs.ErrExist
}

// UntrustedError names what makes a simulated host tree's directory
// untrusted: Path (the directory, a parent of it, or a file of the tree)
// and why. Nothing was made or read there.
type UntrustedError struct {
	Dir    string // the tree's directory
	Path   string
	Reason string // "owned by uid 65534", "writable by group or others (mode 0777)", ...
}

func (e *UntrustedError) Error() string {
	what := e.Path
	if e.Path != e.Dir {
		what = fmt.Sprintf("%s (of simulated host tree %s)", e.Path, e.Dir)
	}
	return fmt.Sprintf("%s is %s: another user could point the simulated GPUs at any device; refusing it (use a directory that root owns and only root can write, in directories that root owns and only root can write)", what, e.Reason)
}

// Is makes errors.Is(err, ErrUntrusted) and errors.Is(err,
// node.ErrInvalid) hold.
func (e *UntrustedError) Is(target error) bool { return errors.Is(ErrUntrusted, target) }
