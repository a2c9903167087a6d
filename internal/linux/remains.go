package linux

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Mark names the processes a daemon started, whatever their pids: those
// whose command (/proc/<pid>/comm) begins with Comm and whose environment
// holds Env ("KEY=VALUE") exactly. A daemon that puts a mark of its own in
// its environment, which its children inherit, is found with them by it
// after it was killed. The zero Mark, or one with Env empty, names none.
type Mark struct {
	Comm string
	Env  string
}

// Marked lists the live processes under procRoot that mark names.
func Marked(procRoot string, mark Mark) []Process {
	if mark.Env == "" {
		return nil
	}
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil
	}
	want := []byte(mark.Env)
	var out []Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "comm"))
		if err != nil || !strings.HasPrefix(strings.TrimSpace(string(comm)), mark.Comm) {
			continue
		}
		env, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "environ"))
		if err != nil || !slices.ContainsFunc(bytes.Split(env, []byte{0}), func(kv []byte) bool { return bytes.Equal(kv, want) }) {
			continue
		}
		st, err := ReadProcStat(procRoot, pid)
		if err != nil || st.Exited() {
			continue
		}
		out = append(out, Process{Pid: pid, Start: st.Start})
	}
	return out
}

// Remains are what a stopped daemon leaves on the host, each part
// optional, in the order Reclaim takes them back:
//   - Processes, then the processes Marked finds (listed once those are
//     gone, so that none a process started on its way out is missed);
//   - Empty: directories emptied and kept (a container may have them
//     mounted);
//   - Mounts: the file systems mounted on each path, all of them (a tmpfs
//     of the daemon's own, say);
//   - Cgroup in every hierarchy of Hierarchies, then its parent as well
//     when ParentToo and nothing else is left in it;
//   - Dir and all it holds.
type Remains struct {
	Processes   []Process
	Marked      Mark
	Empty       []string
	Mounts      []string
	Hierarchies []CgroupHierarchy
	Cgroup      string
	ParentToo   bool
	Dir         string
}

// Reclaim takes back what r names, in its order. Each process is killed
// only while it is still the one its pid and start time name (End), and
// waited for at most bound; one that runs on is an error matching
// ErrStillRuns, and then nothing else is touched: a live process may still
// use it. A part that is already gone is not an error.
func Reclaim(ctx context.Context, procRoot string, r Remains, bound time.Duration) error {
	var errs []error
	end := func(procs []Process) {
		for _, p := range procs {
			if p.Pid <= 0 {
				continue
			}
			if err := End(ctx, procRoot, p, bound); err != nil {
				errs = append(errs, err)
			}
		}
	}
	end(r.Processes)
	end(Marked(procRoot, r.Marked))
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	for _, dir := range r.Empty {
		if err := emptyDir(dir); err != nil {
			return err
		}
	}
	for _, dir := range r.Mounts {
		if err := UnmountAll(dir); err != nil && !errors.Is(err, ErrNotSupported) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if r.Cgroup != "" && len(r.Hierarchies) > 0 {
		if err := RemoveCgroup(r.Hierarchies, r.Cgroup); err != nil {
			return fmt.Errorf("remove cgroup %s: %w", r.Cgroup, err)
		}
		if r.ParentToo {
			RemoveCgroup(r.Hierarchies, path.Dir(r.Cgroup)) // kept while another's is in it
		}
	}
	if r.Dir != "" {
		return os.RemoveAll(r.Dir)
	}
	return nil
}

// emptyDir removes what dir holds, keeping dir; a dir that is not there is
// not an error.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
