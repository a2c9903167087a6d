package cluster

import (
	"bufio"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// hostDirsFile, in the parent of the clusters' directories, lists the host
// directories a cluster made (mount points the host lacked): the last
// cluster to stop removes them.
const hostDirsFile = "host-dirs"

// makeHostDir makes dir and the parents it lacks, and records each it made
// in parent's hostDirsFile.
func makeHostDir(parent, dir string) error {
	var missing []string
	for p := dir; p != "/" && p != "."; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil {
			break
		}
		missing = append(missing, p)
	}
	if len(missing) == 0 {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(parent, hostDirsFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(strings.Join(missing, "\n") + "\n"); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.MkdirAll(dir, 0o755)
}

// otherClusters reports whether parent holds a cluster's directory.
func otherClusters(parent string) bool {
	entries, _ := os.ReadDir(parent)
	return slices.ContainsFunc(entries, func(e fs.DirEntry) bool { return strings.HasPrefix(e.Name(), "k8s-") })
}

// madeHostDirs lists the host directories that parent's clusters made
// and that still exist, deepest first.
func madeHostDirs(parent string) []string {
	f, err := os.Open(filepath.Join(parent, hostDirsFile))
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := sc.Text()
		if _, err := os.Lstat(p); err == nil && filepath.IsAbs(p) && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return out
}

// removeHostDirs removes the host directories the clusters made, when no
// cluster is left under parent to use them (removing a mount point that
// another cluster's kubelet has a mount on would detach that mount). Only
// empty directories go: one that another program has put something in
// since is that program's to keep.
func removeHostDirs(parent string) error {
	if otherClusters(parent) {
		return nil
	}
	var errs []error
	for _, d := range madeHostDirs(parent) {
		// A parent made for a deeper one is empty once that is gone.
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := os.Remove(filepath.Join(parent, hostDirsFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
