package volume

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// maxVersionLen bounds a driver version; real ones are like "535.309.01".
const maxVersionLen = 32

var versionRE = regexp.MustCompile(`^[0-9]+(\.[0-9]+)*$`)

// ValidateVersion checks that v is a driver version (digits separated by
// dots) and so safe to become part of a path.
func ValidateVersion(v string) error {
	if len(v) > maxVersionLen || !versionRE.MatchString(v) {
		return fmt.Errorf("driver version %q: want digits separated by dots: %w", v, ErrInvalidVersion)
	}
	return nil
}

// VersionFunc asks the loaded driver for its version, such as NVML's
// SystemGetDriverVersion. It fails when no kernel driver is loaded.
type VersionFunc func(ctx context.Context) (string, error)

// DriverVersion tells the driver's version: the one given with
// [WithDriverVersion]; else the loaded driver's (the [WithNVML] function,
// then the proc root's driver/nvidia/version); else the suffix of the
// libnvidia-ml.so.<version> file behind the ld.so cache's entry. The result
// is validated.
func (m *Manager) DriverVersion(ctx context.Context) (string, error) {
	if err := m.made(); err != nil {
		return "", err
	}
	if m.cfg.version != "" {
		return m.cfg.version, nil
	}
	var tried []error
	if m.cfg.nvml != nil {
		v, err := m.cfg.nvml(ctx)
		if err == nil {
			err = ValidateVersion(v)
		}
		if err == nil {
			return v, nil
		}
		tried = append(tried, fmt.Errorf("nvml: %w", err))
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if v, err := m.procVersion(); err == nil {
		return v, nil
	} else {
		tried = append(tried, err)
	}
	v, err := m.libraryVersion(ctx)
	if err == nil {
		return v, nil
	}
	tried = append(tried, err)
	return "", &VersionError{Tried: tried}
}

// procVersion reads the loaded kernel module's version, e.g. from
// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 ...".
func (m *Manager) procVersion() (string, error) {
	p := filepath.Join(m.cfg.procRoot, "driver", "nvidia", "version")
	f, err := os.Open(p)
	if err != nil {
		return "", fmt.Errorf("kernel driver: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	if s.Scan() {
		for field := range strings.FieldsSeq(s.Text()) {
			if strings.Contains(field, ".") && ValidateVersion(field) == nil {
				return field, nil
			}
		}
	}
	return "", fmt.Errorf("kernel driver: no version in %s: %w", p, ErrNoDriverVersion)
}

// libraryVersion reads the version from the name of the file that the ld.so
// cache's libnvidia-ml entries resolve to.
func (m *Manager) libraryVersion(ctx context.Context) (string, error) {
	d, err := m.driver(ctx)
	if err != nil {
		return "", err
	}
	const prefix = "libnvidia-ml.so."
	for _, e := range d.cache.Entries {
		if !strings.HasPrefix(e.Key, "libnvidia-ml.so") {
			continue
		}
		resolved, err := resolve(d.root, e.Value)
		if err != nil {
			continue
		}
		name := path.Base(resolved)
		if v, ok := strings.CutPrefix(name, prefix); ok && strings.Contains(v, ".") && ValidateVersion(v) == nil {
			return v, nil
		}
	}
	return "", errors.New("no libnvidia-ml.so.<version> behind the ld.so cache")
}
