package containerizer

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/volume"
)

// ReleaseVolume gives back owner's use of the driver volume: of version,
// the one its record names; with version "" (a record cut short, or one
// that cannot be read), of every version that lists owner as a user. A
// nil manager holds nothing. Each release's error is joined; none stops
// the others. An owner id no container can have (node.ValidateOwner) is
// an error of kind node.ErrInvalid, and nothing is released.
func ReleaseVolume(ctx context.Context, vols *volume.Manager, owner, version string) error {
	if err := node.ValidateOwner(owner); err != nil {
		return fmt.Errorf("release the driver volume: %w", err)
	}
	if vols == nil {
		return nil
	}
	if version != "" {
		return vols.Release(ctx, version, owner)
	}
	vs, err := vols.List(ctx)
	errs := []error{err}
	for _, v := range vs {
		if slices.Contains(v.Users, owner) {
			errs = append(errs, vols.Release(ctx, v.Version, owner))
		}
	}
	return errors.Join(errs...)
}
