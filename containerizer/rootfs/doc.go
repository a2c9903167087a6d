// Package rootfs unpacks a container image into a directory that a native
// container runs in as its root file system (containerizer.Spec.RootFS).
//
// [Unpack] reads an OCI image layout (a directory, or a tar of one) or the tar
// that `docker save` writes, applies the image's layers in order, with their
// whiteouts (".wh.NAME" removes NAME, ".wh..wh..opq" hides what lower layers
// put in a directory), and returns the image's configuration: its labels and
// environment decide whether the container gets the driver volume, as for a
// Docker image.
//
// Every write goes through an [os.Root] on the destination: an entry named
// "../x", or one reached through a symlink a layer planted, cannot land
// outside it. Device nodes in layers are skipped (a native container has
// its own /dev); ownership is kept when the caller is root.
package rootfs
