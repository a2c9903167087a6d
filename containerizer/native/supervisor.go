package native

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// Several processes may share one state directory (each launching and
// supervising its own containers, as gpurun does). Each container's
// directory names its supervisor, the process that launched it (or adopted
// it in Recover), in supervisor.json, from the moment the directory exists:
// it is made under a temporary name (".new-<id>.<pid>.<start>") holding the
// file and renamed into place. Recover and Clean touch only containers whose
// supervisor is this process or provably dead, so one process's recovery
// never tears down a container that another live process is launching or
// running.

const (
	supervisorFile = "supervisor.json"
	claimPrefix    = ".new-"
	tempPrefix     = ".tmp-"
)

// CgroupParent is the cgroup parent for the containers of a state
// directory: "gpuiso/i<12 hex digits of the directory's hash>". New puts an
// isolator left on the package default parent there. Containerizers on
// distinct state directories then never see each other's cgroups, and
// Recover's removal of cgroups no record explains stays within its own.
func CgroupParent(stateDir string) string {
	return containerizer.CgroupParent("i", "", stateDir)
}

// self names this process as a supervisor; the zero Holder where the proc
// file system cannot tell (then nothing is ever proven dead either).
func self(procRoot string) allocator.Holder {
	h, err := allocator.ProcessHolder(procRoot, os.Getpid())
	if err != nil {
		return allocator.Holder{}
	}
	return h
}

// holder is this process as the holder of GPUs it allocates, or nil where
// the proc file system cannot tell.
func (r *runner) holder() *allocator.Holder {
	if !r.self.Valid() {
		return nil
	}
	h := r.self
	return &h
}

// claimName is the name of a claim directory of this process for container
// id: ".new-<id>.<pid>.<start>", the process in node.Process's text form.
func (r *runner) claimName(id string) string {
	return claimPrefix + id + "." + r.self.String()
}

// claim makes container id's directory, holding its supervisor record.
func (r *runner) claim(id string) error {
	tmp := filepath.Join(r.cfg.StateDir, r.claimName(id))
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return err
	}
	if err := writeSupervisor(tmp, id, r.self); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, r.dir(id)); err != nil {
		os.RemoveAll(tmp)
		if errors.Is(err, fs.ErrExist) || linux.NotEmpty(err) {
			return fmt.Errorf("%w: state of an earlier container %s is left (run Recover or Clean)", containerizer.ErrContainerExists, id)
		}
		return err
	}
	return nil
}

// deadClaim tells whether name is a claim directory of a dead process.
func (r *runner) deadClaim(name string) bool {
	rest, ok := strings.CutPrefix(name, claimPrefix)
	if !ok {
		return false
	}
	f := strings.Split(rest, ".")
	if len(f) < 3 {
		return false
	}
	p, err := node.ParseProcess(f[len(f)-2] + "." + f[len(f)-1])
	return err == nil && r.dead(p)
}

// dead tells whether p has provably died (and is not this process).
func (r *runner) dead(p node.Process) bool {
	return p != r.self && linux.Dead(r.cfg.ProcRoot, p)
}

// TempDir makes a directory under the state directory for this process's
// own use while it runs, such as the unpacked image a container of it runs
// in. Its name records this process (".tmp-<pid>.<start time>-<random>"):
// Clean removes it once the process has died, after tearing down that
// process's containers, so a program killed at any point leaves none
// behind. Containers that keep the host's file system do not see it, as
// they do not see the state directory. Remove it when done with it.
// Recover leaves the directories of dead processes alone, since a
// container it re-adopts may run in one. It is the Lifecycle's TempDir,
// which a Lifecycle over NewRuntime's Runtime has too
// (containerizer.TempDirMaker).
func (c *Containerizer) TempDir() (string, error) {
	if c == nil || c.rt == nil {
		return "", fmt.Errorf("temporary directory: %w", containerizer.ErrNotMade)
	}
	return c.rt.TempDir()
}

// TempDir makes a directory as Containerizer.TempDir says.
func (r *runner) TempDir() (string, error) {
	return linux.MkdirOwned(r.cfg.StateDir, tempPrefix, r.self)
}

// ProcRoot is the proc file system in which the runtime tells processes
// dead or alive (Config.ProcRoot): its Lifecycle's too.
func (r *runner) ProcRoot() string { return r.cfg.ProcRoot }

// deadTemp tells whether name is a TempDir of a dead process.
func (r *runner) deadTemp(name string) bool {
	p, ok := linux.OwnerOfName(name, tempPrefix)
	return ok && r.dead(p)
}

// removeDir removes container id's directory: first renamed to a claim name
// of this process, so that a crash half way through leaves a directory
// that Clean and Recover remove, never one without its supervisor record.
func (r *runner) removeDir(id string) error {
	tmp := filepath.Join(r.cfg.StateDir, r.claimName(id))
	if err := os.Rename(r.dir(id), tmp); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	return os.RemoveAll(tmp)
}
