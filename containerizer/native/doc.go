// Package native runs GPU containers as host processes, the way Mesos' native
// containerizer with --isolation="cgroups/devices,gpu/nvidia" does.
//
// # The model
//
// A container is a command in its own mount, pid, cgroup, IPC, UTS and
// network namespaces, with
//
//   - its own device cgroup (package isolator/cgroups, v1 or v2) allowing the
//     runtime's default devices, the driver's control devices and exactly the
//     GPUs the allocator gave it; with Spec.CPUAffinity numa, pinned as well
//     to the CPUs and memory nodes of its GPUs' NUMA nodes (the cpuset
//     controller, set before its init runs and again after an Update);
//   - a private /dev: a tmpfs holding the usual pseudo devices, and the
//     control devices and only its own GPU nodes, bind-mounted from the
//     host's dev root under their own names;
//   - the host's root file system, and with it the host's driver exactly as
//     it is installed: no volume is mounted over it, since mounting one
//     over /usr/local/nvidia would hide a driver that lives there (the
//     driver volume is for containers with a root file system of their own);
//   - NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES set to its GPUs' UUIDs
//     (void for a container without GPUs, which gets every GPU denied), and
//     the allocation's own environment, such as the MPS memory limit of a
//     GPU shared by memory.
//
// What a container gets is decided by containerizer.Preparer, the step both
// back ends share; this package only runs it.
//
// # Confinement
//
// Every container is confined as Docker confines one by default, so that a
// root process inside cannot undo its device isolation:
//
//   - capabilities: the bounding, effective and permitted sets hold Docker's
//     default list ([DefaultCapabilities]) plus Spec.CapAdd; inheritable and
//     ambient are empty; Spec.User runs the command as another user, which
//     then has none;
//   - no_new_privs, and a seccomp filter equal to Docker's default profile
//     for those capabilities. The profile comes as data from
//     github.com/moby/profiles/seccomp (the very profile Docker loads) and
//     is compiled to BPF by github.com/elastic/go-seccomp-bpf, pure Go, so
//     the module needs no libseccomp and no cgo for it. The filter covers
//     the machine's own ABI: 32-bit and x32 calls are refused outright;
//   - /proc of the container's own pid namespace, with Docker's masked paths
//     (/proc/kcore, /proc/keys, /proc/timer_list, /sys/firmware, ...) and
//     read-only paths (/proc/sys, /proc/sysrq-trigger, ...), and the NVIDIA
//     driver's parameters (/proc/driver/nvidia/params) covered by a read-only
//     copy that says ModifyDeviceFiles: 0: run as root, the driver's
//     libraries would otherwise make the node of every GPU missing from the
//     container's /dev (denied by its cgroup, but there);
//   - /sys read-only, and under it the cgroup file systems of the container's
//     cgroup namespace, read-only: the container sees its own cgroup as the
//     root and can write neither its cgroup.procs nor its devices.allow.
//
// The init applies all of it once it is in its cgroup, on one locked OS
// thread that forks the command and then ends: capability sets, the seccomp
// filter (installed without TSYNC) and the cgroup namespace belong to a
// thread, and the rest of the init keeps its privileges to wait for the
// command and record its exit status.
//
// # The boundary
//
// A native container reaches nothing of the host that Docker's default would
// not let it reach. Sharing anything is an explicit opt-in of the Spec.
//
//   - Network: a network namespace of its own with only a loopback
//     interface (Docker's "none"): no listener on the host's loopback and
//     no abstract UNIX socket of the host (they belong to the network
//     namespace) is reachable. Spec.Network = NetworkHost shares the host's.
//     IPC and UTS namespaces are its own too (its host name is its id).
//   - Descriptors: only 0, 1 and 2 cross into the command, whatever the
//     caller left open without close-on-exec (the init marks every other
//     one close-on-exec first thing, as runc does); Spec.ExtraFiles hands
//     more on purpose, as fds 3, 4, ...
//   - /tmp is a private tmpfs (nosuid, nodev) in every container, and so is
//     /var/tmp in a container that keeps the host's file system: neither
//     of the host's shared, world-writable directories is reachable.
//     /dev/shm is a private tmpfs of 64 MiB (nosuid, nodev, noexec), as
//     Docker's: a write past it fails with ENOSPC; a memory share's
//     container has its MPS daemon's in its place, as bounded (package
//     isolator/mps). Their pages count in the container's memory cgroup.
//   - Without a root file system of its own the container sees the host's
//     file system read-only, nosuid and nodev, with these rules: the host's
//     runtime directories, /run and /var/run, where daemons keep their
//     control sockets (Docker's, containerd's, Podman's, systemd's), get a
//     private empty tmpfs each, because a read-only mount does not stop
//     connect(2) on a socket; the container engines' state directories
//     (/var/lib/docker, /var/lib/containerd, /var/lib/containers,
//     /var/lib/kubelet, ...) are masked; the containerizer's own state
//     directory is masked, and so are the MPS daemons' of every manager of
//     the node, whatever program made it (Config.MPS's, those recorded in
//     the MPS registry, Config.MPSRegistry, and gpuiso's default state
//     directories, GPUISOStateDirs): a memory share's container reaches its
//     own daemon alone, at /tmp/nvidia-mps, and no container reaches
//     another program's. A socket a host program keeps anywhere else
//     stays reachable read-only; a container with a root file system of
//     its own has none of these concerns, and is the form to use for code
//     you do not trust.
//   - The working directory (Spec.Dir) of a container that keeps the host's
//     file system is shared with the host writable, but nosuid and nodev.
//   - Paths inside a root file system are resolved inside it
//     (github.com/cyphar/filepath-securejoin, the library runc uses): a
//     mount point behind a link in the image (usr/local -> /etc, say) is
//     made and mounted where the link leads inside the root, never on the
//     host; an image whose /dev, /proc or /sys is not a directory of its
//     own is refused. The host's root, or a directory holding the state
//     directory, is refused as a root file system.
//
// # Root file system
//
// With Spec.RootFS (a directory, see package containerizer/rootfs to unpack
// an image into one) the container pivots into it (pivot_root; the host's
// root is detached) with its private /dev, /proc, read-only /sys, and the
// driver volume read-only, nosuid, nodev at /usr/local/nvidia when the image
// asks for it (label com.nvidia.volumes.needed in Spec.Labels, or
// NVIDIA_VISIBLE_DEVICES set and not void in Spec.Env), as for a Docker
// image. Without one, the container keeps the host's file system.
//
// The container's first process is an init: the containerizer's own binary,
// started again with [Init] at the top of its main. It waits, blocked on a
// pipe, until the containerizer has moved it into the container's cgroup, so
// the command never runs a single instruction unconfined. It then sets up the
// mounts, runs the command, records its exit status and exits with it. Inits
// run in their own session: killing the containerizer leaves them running.
//
// # A Lifecycle over a runtime
//
// [Containerizer] is a containerizer.Lifecycle over the native runtime,
// as the Docker containerizer is over the Docker one: the Lifecycle owns
// the states, the launches in progress, the prepare step, the allocator and
// the one recovery; the runtime reserves a container's directory before
// the prepare step (containerizer.Reserver), creates its /dev, cgroup and
// held init, starts it, waits for it, kills and removes it, lists the
// containers from their records, records the supervisor that takes one
// over (containerizer.Adopter), sweeps its own leftovers
// (containerizer.Cleaner) and resizes a running container's GPUs
// (containerizer.Updater); it names this process the supervisor of its
// containers (containerizer.Supervised). [NewRuntime] returns that runtime
// alone, for one Lifecycle over it and other runtimes (Docker's) and one
// allocator; [New] is a Lifecycle over it alone.
//
// Each container has a directory under the state directory (default
// /run/gpuiso/native) holding its supervisor, its record
// (container.json, an entry of the record store of package
// containerizer/record, with the init as its process; written atomically
// against this process's death, once the init's pid is known), its /dev
// and its exit status. A directory without a record is a reservation: a launch in
// progress, or one that a killed process left, which the next recovery
// removes with what was held for it. [containerizer.Lifecycle.Recover]
// reads them after a restart: running containers are re-adopted with their
// GPUs (this process becomes their supervisor), those whose supervisor
// died and that have ended are cleaned up and their GPUs released.
//
// The containerizer depends on an [Isolator] interface (package
// isolator/cgroups implements it), so its bookkeeping is tested without root
// against a recording fake, besides the real root tests.
//
// # Sharing a state directory
//
// Containerizers in several processes may share one state directory (and
// one allocator state directory): gpurun does. Each container's directory
// names its supervisor, the process that launched or adopted it (pid and
// start time), from the moment it exists: it is made under a temporary
// name with the record inside and renamed into place, and it is renamed
// away before it is removed. Recover adopts or tears down only the
// containers of supervisors that provably died (or of this process), and
// Clean tears them down (processes killed, cgroup, /dev
// mounts, volume user, GPUs and directory given back) for programs whose
// containers should not outlive them. Neither touches a container of a live
// process. The GPUs of a container are held in the allocator with its
// supervisor as holder. [Containerizer.TempDir] gives a program a directory of its own
// under the state directory (for an unpacked image, say) that Clean removes
// once the program has died.
//
// Each state directory has its own cgroup parent, [CgroupParent]: [New]
// moves an isolator built with cgroups.New() (the shared default parent)
// there, so that two programs built the same way with state directories
// of their own cannot touch each other's containers. Cgroups that no
// directory explains are removed only within that own parent, and only
// those that are no parent of cgroups themselves; each removal is bounded
// in time, and the parent goes once its last container has.
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
// allocates first, records that, then adds the nodes and the cgroup rules.
// Shrinking denies the GPUs that go (rules, then nodes) before it frees
// them in the allocator, then records that, so that a GPU is never
// reachable from two containers. The allocator is the record of what a
// container holds: a process killed at any step leaves a container that
// Recover adopts with what the allocator holds, its rules, /dev nodes and
// record made that again (containerizer.Repairer).
package native
