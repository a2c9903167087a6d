// Package volume gathers the host's NVIDIA driver into a versioned,
// read-only volume for containers, decides which containers get it, and
// checks an image's CUDA requirements against the driver and the GPUs.
//
// # The model
//
// A container's CUDA libraries must match the host's kernel driver exactly,
// so the container takes the driver's user-space part from the host: the
// volume nvidia_<version> under the [Manager]'s root (default [DefaultRoot])
// holds bin/ (nvidia-smi, ...), lib/ (32-bit libraries) and lib64/ (64-bit
// libraries) with their soname symlinks and libcuda.so -> libcuda.so.1. It is
// mounted at /usr/local/nvidia, read-only, nosuid and nodev.
//
// What belongs in it ([Manager.Contents]) is worked out from the ld.so cache
// of the driver root (read with internal/ldcache): the directories the cache
// names are the library directories. Libraries are matched by name by
// capability (utility, compute, video, graphics, compat32; display adds only
// a device node), their symlink chains resolved inside the driver root
// (Debian reaches its driver through /etc/alternatives; a driver on its own
// file system through /lib symlinks into /usr/local/nvidia/lib64), refused
// only when a chain escapes the root, kept only when the file ends in
// .so.<driver version>, and split into lib/ and lib64/ by the ELF class read
// from the file. The driver root is the first of [DefaultDriverRoots] whose
// cache names NVIDIA's libraries (/, then a containerised driver's
// /run/nvidia/driver, then GKE's directory), or the one [WithDriverRoot]
// gives. Vendor-neutral libGL, libEGL
// and libGLES* are taken only when the file needs NVIDIA's GL core or GLVND's
// dispatcher, never Mesa's. Programs are looked up on the binary directories.
// [Manager.Library] finds one library of the driver root the same way (the
// file a program loads NVML from, for a driver installed under another root).
// Every host path (driver root, ld.so cache, binary and library directories,
// proc root, volume root) can be moved, with the real one as the default.
//
// # Building
//
// [Manager.Build] finds the driver version (given, from NVML, from
// /proc/driver/nvidia/version, or from the libnvidia-ml.so.<version> file),
// takes the root's lock (so goroutines and processes build one volume: the
// others wait and get it), and returns an intact volume as it is. A
// missing or damaged one is built in a temporary directory beside its final
// name, through an os.Root so that no symlink leads a write outside it, and
// then renamed into place (exchanged atomically with a damaged one), so that
// a crash never leaves a half volume under the final name. Files are
// hard-linked from the driver where the root shares its file system, and
// copied otherwise, file by file. The manifest in the volume records every
// file (size, mode, time, the inode of a link, the CRC-32C of a copy) and
// link; Build checks a volume against it before trusting it
// ([WithDeepVerify] also reads the copies).
//
// A volume is a cache of host files, rebuilt whenever it is found wanting,
// so it needs no durability of its own: copied files and their manifest are
// synced before the rename (their bytes exist nowhere else on disk), while a
// build of hard links syncs nothing. After a power loss the rename may be
// lost or the volume incomplete; either way Build sees it, by a missing or
// unsealed manifest or a file that does not match, and builds it again.
//
// Where the root's file system is mounted noexec, Build mounts a tmpfs on the
// root first, as Mesos does. The root and every volume directory must be owned
// by the manager's user (root, in production) and not writable by group or
// others; otherwise the manager refuses them with an [*UnsafeError] and
// changes nothing.
//
// # The lock and the records
//
// Managers sharing a root take turns through the lock file
// .lock/volumes.lock: mode 0600 in a directory of mode 0700, both owned by
// the manager's user, so that no other user can open the file and take its
// flock. (Releases before it locked the root directory itself, which any
// user can open and hold, stalling every manager.) The lock directory is
// made on the root's first use; an existing one others may read (0755) is
// tightened, while a lock directory others may write to, a lock file others
// could open, or a symlink is refused with an [*UnsafeError] and left as it
// is: another user may hold such a file open, and its flock with it,
// whatever its mode becomes, so only whoever runs the managers may remove it
// (with no manager running). The holder writes its pid and start time into
// the file; a wait ends at the manager's lock timeout ([WithLockTimeout],
// [DefaultLockTimeout]) or with the caller's context, whichever comes first,
// in a [*LockError] naming the holder and its command where known. Upgrade:
// the root itself keeps its mode; managers of an older release lock the root
// directory and do not exclude this release's, so every program sharing a
// root is upgraded together, while none runs.
//
// The users' records, .users/<version>/<container>, list containers: their
// directories are 0700 and the files 0600. Records an older release left
// open to others are copied into new private directories that take their
// place, at the first lock, so that a process of another user that had
// opened an old directory lists nothing more through it.
//
// # Lifecycle and ownership
//
// The manager owns everything under its root: the volumes, the users
// directory .users/<version>/<container> that [Manager.Acquire] and
// [Manager.Release] keep, and the tmpfs it may have mounted (never unmounted:
// containers may still use it). Several versions live side by side;
// [Manager.GC] removes those no container uses.
//
// # What a container gets
//
// [Image.NeedsVolume] decides from an image's labels and environment whether
// its containers get the volume; [Check] evaluates its NVIDIA_REQUIRE_*
// expressions (and the legacy CUDA_VERSION and com.nvidia.cuda.version
// forms) against the [Driver] and the allocated GPUs; [Volume.Injection]
// returns the mount and environment as plain data for the isolators.
// Brands compare by the names NVIDIA's runtime gives them ([BrandName]:
// GPUs newer than TITAN are Unknown).
//
// CUDA forward compatibility: /usr/local/cuda/compat goes first in
// LD_LIBRARY_PATH only when [DecideCompat] finds there a libcuda newer than
// the driver and made for its branch (its .note.cuda.fwd_compatibility ELF
// note lists the branch; without a note, its major version is higher).
// That needs the image's files: [Volume.InjectionCompat] takes the decision
// of [CompatFor]; [Volume.Injection], for callers without a root file system
// (Docker images), never adds it.
//
// The package never logs unless given a logger with [WithLogger].
package volume
