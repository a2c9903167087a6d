//go:build !linux

package linux

// CgroupHierarchies is not supported on this operating system.
func CgroupHierarchies(string) ([]CgroupHierarchy, error) { return nil, ErrNotSupported }

// MakeCgroup is not supported on this operating system.
func MakeCgroup([]CgroupHierarchy, string) error { return ErrNotSupported }

// MoveToCgroup is not supported on this operating system.
func MoveToCgroup([]CgroupHierarchy, string, int, string) error { return ErrNotSupported }

// OwnCgroups is not supported on this operating system.
func OwnCgroups(string) (map[string]string, error) { return nil, ErrNotSupported }

// CgroupProcesses is not supported on this operating system.
func CgroupProcesses(CgroupHierarchy, string) ([]int, error) { return nil, ErrNotSupported }

// RemoveCgroup is not supported on this operating system.
func RemoveCgroup([]CgroupHierarchy, string) error { return ErrNotSupported }
