package dra

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// MetadataDir is the directory, under the kubelet plugin's data directory,
// where the framework writes the device metadata files of the claims it
// prepared (kubeletplugin.EnableDeviceMetadata): one directory
// "<namespace>_<name>" per claim. Their CDI specs are files
// "<driver>_metadata_<claim uid>_<request>.json" of the CDI directory.
const MetadataDir = "dra-device-metadata"

// SweepMetadata removes the device metadata files, and their CDI specs,
// of the claims that are no longer prepared, and returns the uids of the
// claims whose specs it removed, sorted. The framework removes them when
// this driver unprepares a claim; a release before device metadata
// unprepares the claims this one prepared (a rollback with claims
// prepared) and leaves them. Call it when the plugin starts: a claim's
// checkpoint is written before its metadata and removed before it, so
// the files are read before the checkpoints and only those of a claim
// without one then go, even while another instance prepares claims (a
// rolling update). A claim whose checkpoint cannot be read keeps its
// spec, and then no metadata directory goes (its namespace and name are
// unknown). dataDir is the plugin's data directory; a missing directory
// has nothing to sweep. Failures are joined; every other file is still
// removed.
func (d *Driver) SweepMetadata(dataDir string) ([]string, error) {
	root := filepath.Join(dataDir, MetadataDir)
	dirs, err := os.ReadDir(root)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("sweep device metadata: %w", err)
	}
	prefix := d.cfg.DriverName + "_metadata_"
	specs, err := os.ReadDir(d.cfg.CDIDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("sweep device metadata: %w", err)
	}
	uids, err := d.cps.list()
	if err != nil {
		return nil, fmt.Errorf("sweep device metadata: %w", err)
	}
	keepUID, keepDir, unread := map[string]bool{}, map[string]bool{}, false
	for _, uid := range uids {
		keepUID[uid] = true
		cp, ok, err := d.cps.read(uid)
		switch {
		case err != nil:
			unread = true
		case ok:
			keepDir[cp.Namespace+"_"+cp.Name] = true
		}
	}
	var errs []error
	var removed []string
	for _, e := range specs {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		uid, _, found := strings.Cut(rest, "_")
		if !ok || !found || !strings.HasSuffix(rest, ".json") || keepUID[uid] {
			continue
		}
		if err := os.Remove(filepath.Join(d.cfg.CDIDir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("sweep device metadata: %w", err))
			continue
		}
		if len(removed) == 0 || removed[len(removed)-1] != uid {
			removed = append(removed, uid)
		}
	}
	for _, e := range dirs {
		if unread || keepDir[e.Name()] || !e.IsDir() {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("sweep device metadata: %w", err))
		}
	}
	return removed, errors.Join(errs...)
}
