package native

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/gpuiso/gpuiso/internal/linux"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
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
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		abs = stateDir
	}
	sum := sha256.Sum256([]byte(filepath.Clean(abs)))
	return cgroups.DefaultParent + "/i" + hex.EncodeToString(sum[:6])
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

func (c *Containerizer) supPath(id string) string { return filepath.Join(c.dir(id), supervisorFile) }

// claim makes container id's directory, holding its supervisor record.
func (c *Containerizer) claim(id string) error {
	tmp := filepath.Join(c.cfg.StateDir, fmt.Sprintf("%s%s.%d.%d", claimPrefix, id, c.self.Pid, c.self.Start))
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(tmp, supervisorFile), c.self); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, c.dir(id)); err != nil {
		os.RemoveAll(tmp)
		if errors.Is(err, fs.ErrExist) || linux.NotEmpty(err) {
			return fmt.Errorf("%w: state of an earlier container %s is left (run Recover or Clean)", containerizer.ErrContainerExists, id)
		}
		return err
	}
	return nil
}

// supervisedElsewhere tells whether container id's directory names a live
// supervisor other than this process: such a container is not this
// process's to recover or clean.
func (c *Containerizer) supervisedElsewhere(id string) bool {
	var sup allocator.Holder
	if err := readJSON(c.supPath(id), &sup); err != nil {
		// A directory an older version made has no supervisor record;
		// one being removed has none any more.
		return false
	}
	if sup == c.self {
		return false
	}
	return !sup.Dead(c.cfg.ProcRoot)
}

// deadClaim tells whether name is a claim directory of a dead process.
func (c *Containerizer) deadClaim(name string) bool {
	rest, ok := strings.CutPrefix(name, claimPrefix)
	if !ok {
		return false
	}
	f := strings.Split(rest, ".")
	if len(f) < 3 {
		return false
	}
	return c.dead(f[len(f)-2], f[len(f)-1])
}

// dead tells whether the process of that pid and start time has provably
// died (and is not this one).
func (c *Containerizer) dead(pidStr, startStr string) bool {
	pid, err1 := strconv.Atoi(pidStr)
	start, err2 := strconv.ParseUint(startStr, 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 {
		return false
	}
	h := allocator.Holder{Pid: pid, Start: start}
	return h != c.self && h.Dead(c.cfg.ProcRoot)
}

// TempDir makes a directory under the state directory for this process's
// own use while it runs, such as the unpacked image a container of it runs
// in. Its name records this process (".tmp-<pid>.<start time>-<random>"):
// Clean removes it once the process has died, after tearing down that
// process's containers, so a program killed at any point leaves none
// behind. Containers that keep the host's file system do not see it, as
// they do not see the state directory. Remove it when done with it.
// Recover leaves the directories of dead processes alone, since a
// container it re-adopts may run in one.
func (c *Containerizer) TempDir() (string, error) {
	if c.prep == nil {
		return "", fmt.Errorf("temporary directory: %w", containerizer.ErrNotMade)
	}
	return os.MkdirTemp(c.cfg.StateDir, fmt.Sprintf("%s%d.%d-", tempPrefix, c.self.Pid, c.self.Start))
}

// deadTemp tells whether name is a TempDir of a dead process.
func (c *Containerizer) deadTemp(name string) bool {
	rest, ok := strings.CutPrefix(name, tempPrefix)
	if !ok {
		return false
	}
	id, _, ok := strings.Cut(rest, "-")
	pid, start, ok2 := strings.Cut(id, ".")
	return ok && ok2 && c.dead(pid, start)
}

// Clean tears down the containers of the state directory whose supervisor
// is provably dead, then removes the TempDir directories of dead processes
// and the state directory's own cgroup parent once it is empty: it kills their processes and gives back their cgroups,
// /dev mounts, volume users, GPUs and directories, as Destroy does. It
// leaves alone containers this process knows and those of live supervisors,
// and returns the ids it cleaned. A program that runs its containers only
// while it lives (gpurun) calls Clean at its start; an agent that re-adopts
// its containers after a restart calls Recover instead.
func (c *Containerizer) Clean(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(c.cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("clean: %w", err)
	}
	var cleaned, temps []string
	var errs []error
	for _, e := range entries {
		id := e.Name()
		if c.deadTemp(id) {
			temps = append(temps, id) // once the containers are gone
			continue
		}
		if c.deadClaim(id) {
			if err := os.RemoveAll(filepath.Join(c.cfg.StateDir, id)); err != nil {
				errs = append(errs, fmt.Errorf("clean: %w", err))
			}
			continue
		}
		if !e.IsDir() || node.ValidateOwner(id) != nil {
			continue
		}
		if _, err := c.get(id); err == nil {
			continue
		}
		var sup allocator.Holder
		if err := readJSON(c.supPath(id), &sup); err != nil || sup == c.self || !sup.Dead(c.cfg.ProcRoot) {
			continue
		}
		var rec record
		if err := readJSON(c.recPath(id), &rec); err != nil {
			rec = record{ID: id}
		}
		c.cfg.Logger.Info("cleaning up a container whose supervisor died", "id", id, "supervisor", sup.Pid)
		if err := c.teardown(ctx, id, rec); err != nil {
			errs = append(errs, fmt.Errorf("clean %s: %w", id, err))
			continue
		}
		cleaned = append(cleaned, id)
	}
	if len(errs) == 0 {
		// No container of a dead process runs in its directories any more.
		for _, name := range temps {
			c.cfg.Logger.Info("removing a temporary directory of a dead process", "dir", name)
			if err := os.RemoveAll(filepath.Join(c.cfg.StateDir, name)); err != nil {
				errs = append(errs, fmt.Errorf("clean: %w", err))
			}
		}
	}
	c.removeParent() // if nothing is left in it
	return cleaned, errors.Join(errs...)
}

// releaseVolumeUser removes id as a user of every volume that lists it: for
// a container whose record did not yet name its volume.
func (c *Containerizer) releaseVolumeUser(ctx context.Context, id string) error {
	vols, err := c.cfg.Volumes.List(ctx)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	for _, v := range vols {
		if slices.Contains(v.Users, id) {
			if err := c.cfg.Volumes.Release(ctx, v.Version, id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// removeDir removes container id's directory: first renamed to a claim name
// of this process, so that a crash half way through leaves a directory
// that Clean and Recover remove, never one without its supervisor record.
func (c *Containerizer) removeDir(id string) error {
	tmp := filepath.Join(c.cfg.StateDir, fmt.Sprintf("%s%s.%d.%d", claimPrefix, id, c.self.Pid, c.self.Start))
	if err := os.Rename(c.dir(id), tmp); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	return os.RemoveAll(tmp)
}
