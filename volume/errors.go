package volume

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

var (
	// ErrInvalidVersion: a driver version is not digits separated by dots.
	ErrInvalidVersion = node.Sentinel(node.ErrInvalid, "invalid driver version")
	// ErrInvalidName: a name (a user, a capability, a library name from the
	// ld.so cache) is not acceptable, e.g. it holds "/" or "..".
	ErrInvalidName = node.Sentinel(node.ErrInvalid, "invalid name")
	// ErrNoDriverVersion: no source could tell the driver's version.
	ErrNoDriverVersion = node.Sentinel(node.ErrUnavailable, "driver version unknown")
	// ErrNoDriver: the driver root holds none of the driver's files.
	ErrNoDriver = node.Sentinel(node.ErrNotFound, "no NVIDIA driver files found")
	// ErrEscapesRoot: a symlink chain leads out of the driver root.
	ErrEscapesRoot = node.Sentinel(node.ErrInvalid, "escapes the driver root")
	// ErrVersionMismatch: the driver version given is not the version of
	// the driver files found.
	ErrVersionMismatch = node.Sentinel(node.ErrInvalid, "driver version does not match the driver files")
	// ErrUnsafe: the root, a version directory, the lock or the users'
	// records could be changed (or the lock opened) by someone other than
	// the manager's user (wrong owner, group- or other-writable, a lock
	// file open to others, a symlink).
	ErrUnsafe = node.Sentinel(node.ErrCorrupt, "unsafe volume directory")
	// ErrDamaged: a volume does not match its manifest.
	ErrDamaged = node.Sentinel(node.ErrCorrupt, "volume damaged")
	// ErrNotFound: no volume of that version exists.
	ErrNotFound = node.Sentinel(node.ErrNotFound, "volume not found")
	// ErrInvalidRequirement: an NVIDIA_REQUIRE_* expression does not parse.
	ErrInvalidRequirement = node.Sentinel(node.ErrInvalid, "invalid requirement")
	// ErrRequirementUnmet: the driver or an allocated GPU does not meet an
	// image's requirement.
	ErrRequirementUnmet = node.Sentinel(node.ErrNotSupported, "requirement unmet")
	// ErrLocked: another process held the root's lock until the wait for it
	// ended (the lock timeout, or the caller's context). See LockError.
	ErrLocked = node.Sentinel(node.ErrUnavailable, "volume root locked")
)

// UnsafeError is a directory the manager refuses to use or trust.
type UnsafeError struct {
	Path   string
	Reason string
}

func (e *UnsafeError) Error() string { return fmt.Sprintf("unsafe %s: %s", e.Path, e.Reason) }

// Is matches ErrUnsafe and node.ErrCorrupt.
func (e *UnsafeError) Is(target error) bool { return errors.Is(ErrUnsafe, target) }

// DamagedError is a volume that differs from its manifest.
type DamagedError struct {
	// Path is the volume's directory.
	Path string
	// Problems list what differs, one per file.
	Problems []string
}

func (e *DamagedError) Error() string {
	return fmt.Sprintf("volume %s damaged: %s", e.Path, strings.Join(e.Problems, "; "))
}

// Is matches ErrDamaged and node.ErrCorrupt.
func (e *DamagedError) Is(target error) bool { return errors.Is(ErrDamaged, target) }

// VersionError tells why no source could tell the driver's version.
type VersionError struct {
	// Tried holds the failure of each source, in the order tried.
	Tried []error
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("driver version unknown: %v", errors.Join(e.Tried...))
}

// Is matches ErrNoDriverVersion and node.ErrUnavailable.
func (e *VersionError) Is(target error) bool { return errors.Is(ErrNoDriverVersion, target) }

// Unwrap returns the failures of the sources.
func (e *VersionError) Unwrap() []error { return e.Tried }

// SyntaxError is an NVIDIA_REQUIRE_* expression that does not parse.
type SyntaxError struct {
	// Expr is the whole expression; Token the part that is wrong.
	Expr, Token string
	// Reason says what is wrong with Token.
	Reason string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("requirement %q: %q: %s", e.Expr, e.Token, e.Reason)
}

// Is matches ErrInvalidRequirement and node.ErrInvalid.
func (e *SyntaxError) Is(target error) bool { return errors.Is(ErrInvalidRequirement, target) }

// UnmetError is an image requirement the driver or a GPU does not meet.
type UnmetError struct {
	// Source names where the requirement came from: an environment
	// variable ("NVIDIA_REQUIRE_CUDA", "CUDA_VERSION") or a label.
	Source string
	// Expr is the requirement as written (or implied).
	Expr string
	// Failed holds, for each alternative of Expr, its first condition that
	// does not hold.
	Failed []Condition
	// Driver and CUDA are the driver's version and its CUDA version ("" when
	// unknown).
	Driver, CUDA string
	// GPU is the NVML index of the GPU that fails the requirement, or -1 when
	// the driver alone fails it. Arch and Brand are that GPU's.
	GPU         int
	Arch, Brand string
}

func (e *UnmetError) Error() string {
	cuda := e.CUDA
	if cuda == "" {
		cuda = "unknown"
	}
	s := fmt.Sprintf("%s %q unmet by driver %s (cuda %s)", e.Source, e.Expr, e.Driver, cuda)
	if e.GPU >= 0 {
		s += fmt.Sprintf(" on gpu %d (arch %s, brand %s)", e.GPU, e.Arch, e.Brand)
	}
	var failed []string
	for _, c := range e.Failed {
		failed = append(failed, c.String())
	}
	if len(failed) > 0 {
		s += ": " + strings.Join(failed, " and ") + " false"
	}
	return s
}

// Is matches ErrRequirementUnmet and node.ErrNotSupported.
func (e *UnmetError) Is(target error) bool { return errors.Is(ErrRequirementUnmet, target) }

// VersionMismatchError is a driver version, given rather than detected,
// that the driver's library files are not of.
type VersionMismatchError struct {
	// Version is the version given.
	Version string
	// Found are the versions of the driver's library files.
	Found []string
}

func (e *VersionMismatchError) Error() string {
	return fmt.Sprintf("driver version %s: the driver files found are of %s", e.Version, strings.Join(e.Found, ", "))
}

// Is matches ErrVersionMismatch and node.ErrInvalid.
func (e *VersionMismatchError) Is(target error) bool { return errors.Is(ErrVersionMismatch, target) }

// LockError is a wait for the root's lock that ended (at the manager's lock
// timeout, or with the caller's context) while another process held it.
type LockError struct {
	// Root is the volume root.
	Root string
	// Holder is the process holding the lock, as it named itself on taking
	// it; nil when unknown (it wrote no name, or no longer runs).
	Holder *node.Process
	// Command is the holder's command name, "" when unknown.
	Command string
	// Err is why the wait ended: context.DeadlineExceeded, or the
	// context's cause.
	Err error
}

func (e *LockError) Error() string {
	who := "another process (unknown)"
	if e.Holder != nil {
		who = fmt.Sprintf("pid %d started at %d", e.Holder.Pid, e.Holder.Start)
		if e.Command != "" {
			who = fmt.Sprintf("pid %d (%s) started at %d", e.Holder.Pid, e.Command, e.Holder.Start)
		}
	}
	return fmt.Sprintf("volume root %s held by %s: %v: %s", e.Root, who, e.Err, ErrLocked)
}

// Unwrap returns why the wait ended.
func (e *LockError) Unwrap() error { return e.Err }

// Is matches ErrLocked and node.ErrUnavailable.
func (e *LockError) Is(target error) bool { return errors.Is(ErrLocked, target) }
