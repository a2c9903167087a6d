package rootfs_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/rootfs"
)

// Unpack an image with a larger byte limit and a scratch directory on the
// same disk as the destination, then find the user and working directory
// its container runs with.
func ExampleUnpack() {
	ctx := context.Background()
	state := "/var/lib/app"
	root := filepath.Join(state, "rootfs")
	img, err := rootfs.Unpack(ctx, "image.tar", root,
		rootfs.WithLimits(rootfs.Limits{Bytes: 64 << 30}),
		rootfs.WithScratchDir(state))
	var limit *rootfs.LimitError
	switch {
	case errors.As(err, &limit):
		fmt.Println("refused, raise", limit.Limit)
		return
	case err != nil:
		fmt.Println(err)
		return
	}
	user, err := rootfs.ResolveUser(root, img.User)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := rootfs.EnsureDir(root, img.WorkingDir); err != nil {
		fmt.Println(err)
		return
	}
	spec := containerizer.Spec{RootFS: root, User: &user, Dir: img.WorkingDir, Env: img.Env, Labels: img.Labels}
	_ = spec
}
