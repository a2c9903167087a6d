package cdi

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	cdilib "tags.cncf.io/container-device-interface/pkg/cdi"
)

// DefaultDirs are the spec directories CDI runtimes read, lowest priority
// first: /etc/cdi, then /var/run/cdi.
func DefaultDirs() []string { return slices.Clone(cdilib.DefaultSpecDirs) }

// List returns the qualified names of the devices that the specs in dirs
// (default DefaultDirs) define, as a CDI runtime resolves them, sorted. A
// spec file the library refuses does not hide the others: its error is
// joined into the returned error, one per file, beside the names of the
// valid ones.
func List(dirs ...string) ([]string, error) {
	if len(dirs) == 0 {
		dirs = DefaultDirs()
	}
	cache, err := cdilib.NewCache(cdilib.WithSpecDirs(dirs...), cdilib.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("list CDI devices: %w", err)
	}
	names := cache.ListDevices()
	slices.Sort(names)
	var errs []error
	perFile := cache.GetErrors()
	for _, path := range slices.Sorted(maps.Keys(perFile)) {
		errs = append(errs, &SpecError{Path: path, Err: errors.Join(perFile[path]...)})
	}
	return names, errors.Join(errs...)
}
