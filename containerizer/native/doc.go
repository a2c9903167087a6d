// Package native runs GPU containers as host processes, the way Mesos' native
// containerizer with --isolation="cgroups/devices,gpu/nvidia" does.
//
// # The model
//
// A container is a command in its own mount namespace, with
//
//   - its own device cgroup (package isolator/cgroups, v1 or v2) allowing the
//     runtime's default devices, the driver's control devices and exactly the
//     GPUs the allocator gave it;
//   - a private /dev: a tmpfs holding the usual pseudo devices, and the
//     control devices and only its own GPU nodes, bind-mounted from the
//     host's dev root under their own names;
//   - the driver volume read-only (nosuid, nodev) at /usr/local/nvidia when the
//     host has a driver;
//   - NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES set to its GPUs' UUIDs,
//     PATH and LD_LIBRARY_PATH reaching the volume.
//
// The container's first process is an init: the containerizer's own binary,
// started again with [Init] at the top of its main. It waits, blocked on a
// pipe, until the containerizer has moved it into the container's cgroup, so
// the command never runs a single instruction unconfined. It then sets up the
// mounts, runs the command, records its exit status and exits with it. Inits
// run in their own session: killing the containerizer leaves them running.
//
// Each container has a directory under the state directory (default
// /run/gpuiso/native) holding its record (written atomically), its /dev and
// its exit status. [Containerizer.Recover] reads them after a restart:
// running containers are re-adopted with their GPUs, dead ones are cleaned up
// and their GPUs released.
//
// # Sharing a state directory
//
// Containerizers in several processes may share one state directory (and
// one allocator state directory): gpurun does. Each container's directory
// names its supervisor, the process that launched or adopted it (pid and
// start time), from the moment it exists: it is made under a temporary
// name with the record inside and renamed into place, and it is renamed
// away before it is removed. [Containerizer.Recover] adopts or tears down
// only the containers of supervisors that provably died, and
// [Containerizer.Clean] tears them down (processes killed, cgroup, /dev
// mounts, volume user, GPUs and directory given back) for programs whose
// containers should not outlive them. Neither touches a container of a live
// process. Cgroups that no directory explains are removed only within the
// isolator's own parent: give each state directory its own with
// [CgroupParent].
//
// # Who owns what
//
// The containerizer owns, per container: the allocation named by its id, its
// cgroup, its /dev tmpfs and state directory, and its registration as a user
// of the driver volume. Destroy gives all of them back.
//
// # Live updates
//
// [Containerizer.Update] grows or shrinks a running container's GPUs. Growing
// allocates first, then adds the nodes and the cgroup rules. Shrinking denies
// the GPUs that go (rules, then nodes) before it frees them in the allocator,
// so that a GPU is never reachable from two containers.
package native
