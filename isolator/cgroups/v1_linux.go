package cgroups

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/gpuiso/gpuiso/isolator"
)

// applyV1 writes rules to the devices controller. A new cgroup starts with
// a deny-all and then gets its allows (it holds no process yet). A live one
// gets only the difference against devices.list, allows first, so that a
// device allowed before and after is never denied in between; the result is
// read back and verified.
func (i *Isolator) applyV1(owner string, want []isolator.Rule) error {
	dir := i.Path(owner)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	fresh := false
	if err := os.Mkdir(dir, 0o755); err == nil {
		fresh = true
	} else if !errors.Is(err, fs.ErrExist) {
		return err
	}
	have, err := i.rulesV1(owner)
	if err != nil {
		return err
	}
	if fresh || slices.ContainsFunc(have, func(r isolator.Rule) bool { return r.Type == 'a' }) {
		// Not yet confined (a new cgroup inherits "a *:* rwm"): start from
		// nothing.
		if err := write(dir, "devices.deny", "a"); err != nil {
			return err
		}
		have = nil
	}
	for _, r := range want {
		if !slices.Contains(have, r) {
			if err := write(dir, "devices.allow", r.String()); err != nil {
				return err
			}
		}
	}
	for _, r := range have {
		if !slices.Contains(want, r) {
			if err := write(dir, "devices.deny", r.String()); err != nil {
				return err
			}
		}
	}
	got, err := i.rulesV1(owner)
	if err != nil {
		return err
	}
	if !slices.Equal(got, want) {
		return &VerifyError{Owner: owner, Want: want, Got: got}
	}
	return nil
}

func (i *Isolator) rulesV1(owner string) ([]isolator.Rule, error) {
	f, err := os.Open(filepath.Join(i.Path(owner), "devices.list"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rules, err := isolator.ParseDevicesList(f)
	if err != nil {
		return nil, fmt.Errorf("devices.list of %s: %w", owner, err)
	}
	return isolator.Canonical(rules), nil
}

func write(dir, file, value string) error {
	return os.WriteFile(filepath.Join(dir, file), []byte(value), 0)
}
