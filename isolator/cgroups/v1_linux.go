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

// applyV1 writes rules to the devices controller, as v1Transition says
// from what devices.list holds; the result is read back and verified.
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
	for _, w := range v1Transition(have, want, fresh) {
		if err := write(dir, w.File, w.Value); err != nil {
			return err
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
