// Package rootfs unpacks a container image into a directory that a native
// container runs in as its root file system (containerizer.Spec.RootFS),
// and answers what the image says about running it there.
//
// # Unpacking
//
// [Unpack] reads an OCI image layout (a directory, or a tar of one) or the
// tar that `docker save` writes, applies the image's layers in order
// (plain or gzip-compressed tars), with their whiteouts (".wh.NAME"
// removes NAME, ".wh..wh..opq" hides what lower layers put in a
// directory), and returns the image's configuration: its labels and
// environment decide whether the container gets the driver volume, as for
// a Docker image. A tar of an image is first laid out in a scratch
// directory, "gpuiso-unpack-*" under [os.TempDir] or under the directory
// given with [WithScratchDir].
//
// # Limits
//
// An image is outside input, so an unpack is bounded by [Limits]; a zero
// field, or no [WithLimits] at all, takes the default:
//
//   - Bytes ([DefaultBytes], 32 GiB): the file content written, each
//     regular file counted at its full length, holes included. A file
//     whose declared size would pass the limit is refused before any of
//     it is written.
//   - Entries ([DefaultEntries], 2^20): the tar entries read over all
//     layers.
//   - Ratio ([DefaultRatio], 100): how far a compressed layer may expand,
//     its decompressed bytes over the compressed bytes read, once it has
//     passed [RatioFloor] (16 MiB).
//
// The scratch directory has a Bytes and Entries budget of its own. Going
// past a limit is a *[LimitError] that matches [ErrLimit] (and
// node.ErrInvalid); a corrupt or truncated tar or gzip stream matches
// [ErrFormat].
//
// Sparse entries (GNU and PAX formats) stay sparse: whole blocks of zeros,
// in them or in any regular file, are not written but left as holes, so a
// 2 GiB sparse file takes next to no disk.
//
// # Paths stay in the root
//
// Every write goes through an [os.Root] on the destination, and every
// path in the image is resolved inside it, as if the destination were "/"
// (as a process chrooted there sees it): an absolute name, or a symlink
// that a layer planted (absolute, or climbing with ".."), leads to a place
// inside the root, never out of it. An entry whose name climbs above the
// root ("../x", "a/../../x"), a hard link to anything but a regular file
// the image put in the root, and a whiteout of "." or ".." are refused
// with [ErrUnsafe]. An entry that replaces a symlink replaces the link,
// not what it points to. Device nodes and fifos in layers are skipped (a
// native container has its own /dev); ownership is kept when the caller
// is root; modes are kept, set-id bits included, directories getting
// theirs once every layer is in (so that an unpack as another user can
// still fill a read-only directory). Unpack stops between entries, and
// between blocks of a file, when its context is done.
//
// # Nothing left behind
//
// On any error, Unpack removes what it wrote: the directories it made for
// the destination, or, when the destination already existed (it must then
// be empty), everything in it, which is left empty. The scratch directory
// is removed whether Unpack succeeds or not.
//
// # Running the image
//
// [ResolveUser] turns the image's USER (or a --user flag) into the numeric
// user and group, as Docker does, from the /etc/passwd and /etc/group of
// the unpacked root; [EnsureDir] makes the image's WorkingDir there when
// it is missing. Both resolve paths inside the root as Unpack does.
package rootfs
