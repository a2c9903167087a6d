package mps

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/record"
)

// DefaultRegistry is where every Manager records its directory (New): a
// directory of root's alone (0700), one file (0600) per manager directory
// of the node, whatever program made it and wherever its state lies. A
// container runtime reads it (Registered) to hide every MPS daemon of the
// node from its containers, not only those of its own manager. It is on
// /run, as the daemons are: both are gone after a reboot, and a manager
// made again records its directory again.
const DefaultRegistry = "/run/gpuiso/mps-managers"

// registryEntry is the suffix of a registry's entries.
const registryEntry = ".dir"

// register records dir, a manager's directory, in registry (made root's
// alone when missing), and drops the entries of directories that no
// longer exist. An entry is written atomically: a reader sees it whole or
// not at all.
func register(registry, dir string) error {
	if err := os.MkdirAll(filepath.Dir(registry), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(registry, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := ownDir(registry); err != nil {
		return err
	}
	sum := sha256.Sum256([]byte(dir))
	name := hex.EncodeToString(sum[:16]) + registryEntry
	if err := record.Replace(filepath.Join(registry, name), []byte(dir+"\n"), 0o600); err != nil {
		return err
	}
	entries, err := os.ReadDir(registry)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() == name || !strings.HasSuffix(e.Name(), registryEntry) {
			continue
		}
		d, err := readEntry(registry, e.Name(), os.Geteuid())
		if err != nil {
			continue // a reader skips it; its owner may still write it
		}
		if _, err := os.Lstat(d); errors.Is(err, os.ErrNotExist) {
			os.Remove(filepath.Join(registry, e.Name()))
		}
	}
	return nil
}

// Registered lists the manager directories recorded in registry
// (DefaultRegistry, when ""), sorted: those a container must not reach.
// Only root's records count: a registry or an entry that another user owns
// or may write to, or that is not a plain file, is left out and reported
// in the error, joined, beside what was read. A registry that does not
// exist lists none.
func Registered(registry string) ([]string, error) {
	if registry == "" {
		registry = DefaultRegistry
	}
	fi, err := os.Lstat(registry)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("MPS registry %s: %w", registry, err)
	}
	if err := trusted(fi, 0); err != nil {
		return nil, fmt.Errorf("MPS registry %s: %w", registry, err)
	}
	entries, err := os.ReadDir(registry)
	if err != nil {
		return nil, fmt.Errorf("MPS registry %s: %w", registry, err)
	}
	var out []string
	var errs []error
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), registryEntry) {
			continue
		}
		d, err := readEntry(registry, e.Name(), 0)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("MPS registry %s: %w", registry, err)
	}
	return out, nil
}

// readEntry reads the directory an entry of registry names; the entry must
// be a regular file of uid's that no one else may write.
func readEntry(registry, name string, uid int) (string, error) {
	root, err := os.OpenRoot(registry)
	if err != nil {
		return "", err
	}
	defer root.Close()
	fi, err := root.Lstat(name)
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("entry %s is a %v: %w", name, fi.Mode().Type(), ErrInvalid)
	}
	if err := trusted(fi, uid); err != nil {
		return "", fmt.Errorf("entry %s: %w", name, err)
	}
	f, err := root.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return "", err
	}
	d := strings.TrimSuffix(string(b), "\n")
	if !filepath.IsAbs(d) || filepath.Clean(d) != d || strings.ContainsAny(d, "\n\x00") {
		return "", fmt.Errorf("entry %s names %q, not an absolute clean path: %w", name, d, ErrInvalid)
	}
	return d, nil
}

// trusted checks that fi is uid's and that neither group nor others may
// write it.
func trusted(fi os.FileInfo, uid int) error {
	if owner, ok := linux.Owner(fi); ok && int(owner) != uid {
		return fmt.Errorf("owned by uid %d, not %d: %w", owner, uid, ErrInvalid)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("writable by others (%v): %w", fi.Mode().Perm(), ErrInvalid)
	}
	return nil
}
