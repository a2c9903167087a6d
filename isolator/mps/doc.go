// Package mps enforces memory shares and concurrent slices of a GPU with
// NVIDIA's Multi-Process Service: it starts, stops and recovers one MPS
// control daemon per memory share, and one per GPU split in concurrent
// slices (nvidia-cuda-mps-control, from the node's driver), whose state
// lives in one directory that any number of processes may share.
//
// # The model
//
// A memory share (allocator.Share, mode allocator.ShareMemory) is part of
// one GPU's memory, and optionally of its compute, handed to one container.
// Its limits are the package's to derive and check, once ([LimitsOf]), and
// [Manager.StartShare] gives the share an allocation holds (through
// [Manager.Start]) a control daemon of its own:
//
//   - started with CUDA_VISIBLE_DEVICES naming the share's GPU alone (or
//     its MIG device alone, by its "MIG-" UUID, for a share of a MIG
//     device: the allocator shares MIG devices as it shares GPUs), so
//     that its server (nvidia-cuda-mps-server, which the daemon starts when
//     the first CUDA client connects) reaches no other GPU or MIG device;
//   - in a mount namespace of its own, in which a tmpfs covers /tmp, its
//     pipe directory is /tmp/nvidia-mps, its log directory
//     /tmp/nvidia-mps-log and its /dev/shm a directory of its own: the paths
//     its container sees (isolator.WithShare binds the same pipe and shm
//     directories there), so daemon, server and clients agree on every path,
//     and neither the host's /dev/shm nor its /tmp reaches a container;
//   - given its limits before anyone can connect, and read back:
//     set_default_device_pinned_mem_limit 0 <MiB>M (device 0 is the one GPU
//     or MIG device it sees) and, with a compute percentage,
//     set_default_active_thread_percentage;
//   - recorded (daemon.json in its directory: owner, GPU, limits, the
//     process by pid and start time, and a random mark that its environment
//     and its servers' carry, GPUISO_MPS_DAEMON) before and after its
//     process starts, so that a crash at any point leaves it findable. The
//     record is an entry of the record store (package record: versioned,
//     checksummed, replaced atomically); a record of the releases before
//     it (version 1, unchecked) is still read.
//
// Its directory holds pipe/, log/ and shm/, world-writable with the sticky
// bit as /tmp is (the server runs as its client's user); the manager's own
// directory is root's (0700), so only the daemon's namespace and its
// container reach them.
//
// # Bounded like any container
//
// The two directories a share's container writes, pipe/ and shm/, are
// tmpfs mounts of their own (nosuid, nodev, noexec), never the disk the
// manager's directory lies on: shm/ holds at most DefaultShmBytes (64 MiB,
// Docker's default for a container's /dev/shm; WithShmSize), pipe/, which
// holds only the daemon's sockets, FIFOs and lock, DefaultPipeBytes (1
// MiB; WithPipeSize) and 4096 files. A write past them fails with ENOSPC.
// Their pages are memory, charged by the kernel to the memory cgroup of
// the process that first writes each page: what the container writes
// counts in the container's cgroup, as its own /dev/shm would; what the
// daemon's server writes (it shares those pages with its clients) counts in
// the cgroup of the process that started the daemon. The mounts are made
// in the manager's (the host's) mount namespace when a daemon is first
// started, kept when a dead daemon is started again in place (its
// container may hold them), and detached (never through a link) before
// Stop or Sweep removes the directory; a container that still holds one
// keeps it until it ends. log/ is the daemon's own (no container binds it)
// and stays on the disk.
//
// # Out of every container's reach
//
// New records the manager's directory in a registry (DefaultRegistry,
// /run/gpuiso/mps-managers, root's alone; Registered reads it), whatever
// program made the manager and wherever its directory lies, so that a
// container runtime hides every daemon of the node from its containers,
// not only its own manager's: a native container with the host's view
// (package containerizer/native) masks every registered directory, and a
// fixed set of gpuiso's default state directories besides.
//
// Host users are another matter. A daemon's server runs as the uid of the
// client that asked for it (MPS's design: a daemon started by root starts
// servers for any user), and a process of the same uid may trace a
// process of its own and reach its mount namespace, and in it the share's
// /dev/shm and pipe directory, through /proc/<pid>/root. So a daemon's
// servers run a copy of the driver's nvidia-cuda-mps-server that only its
// namespace holds (on its own /tmp), which any user may run and none but
// root may read (0111): the kernel makes a process that runs a program
// its user cannot read non-dumpable, and the /proc entries of a
// non-dumpable process are root's, out of reach of every other process of
// its uid. A node whose driver has no server beside its control daemon is
// ErrNoServer, and no daemon starts. The container's own processes are
// not the manager's to guard: a container run without a user namespace as
// a uid some host user has is within that user's reach, MPS or not; a
// container for a tenant should run as a uid no host user has.
//
// # Life
//
// The first (and only) share of an owner starts its daemon; Start is
// idempotent for the same GPU and limits. [Manager.Stop] sends quit,
// kills a daemon that has not ended within seconds, kills the MPS
// processes that carry its mark (a server whose daemon was killed), each
// only while it is still the process its pid and start time name, then
// unmounts its directories' tmpfs, removes its cgroup and removes the
// directory. [Manager.Sweep] is the recovery of a
// process that crashed: it stops every daemon whose owner it does not keep,
// a daemon whose starter died before recording its pid included (found as
// the holder of its pipe directory's control lock), and removes what a
// command to a daemon left when its process was killed. [Manager.List] reads
// the records; [Manager.Held] asks a daemon which limits it holds. The
// containerizers (package containerizer's Preparer and Lifecycle,
// containerizer/chain) start a share's daemon in the prepare step, stop it
// when the share is released, and sweep and restart them in their
// recoveries.
//
// # A starter that ends before its daemons
//
// A daemon is its starter's child in a session of its own, and by default
// shares its starter's cgroup and has its mount namespace copied from the
// starter's. A starter in a container (a kubelet plugin in its pod) would
// take its daemons with it: the runtime kills every process of a
// container's cgroup when its init ends (one in the host's pid namespace
// included), the container's memory limit counts them, and the
// container's removal detaches the mounts their namespaces took from it.
// Two options keep them apart. [WithCgroup] moves each daemon, right
// after it starts, into <parent>/gpuiso-mps/<owner> in every cgroup
// hierarchy (made then, removed when the daemon stops; the record names
// it), so that it is charged to the parent, beside the containers, and out
// of the runtime's reach; [WithCgroupRoot] and [WithCgroupNamespace] say
// where a container sees the host's hierarchies and from which cgroup
// namespace the move is allowed. [WithMountNamespace] makes each daemon's
// namespace from another's (the node's, through the container runtime
// that started the starter), where the control binary and the daemon's
// directories are named as that namespace names them. A later manager of
// the same directory finds the daemons by their records (pid and start
// time, in the host's pid namespace) and keeps them.
//
// # What is enforced, and what is not
//
// What MPS lets a client decide for itself, and what only its control
// daemon sets (NVIDIA's MPS documentation, and what this package's tests
// show of the 535 driver's daemon, Debian's, and of the 580 driver's on an
// H100 and an H200):
//
//   - CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
//     in a client's environment can only lower the daemon's limits, never
//     raise them. The daemon's Limits.Env (isolator.WithShare) sets both in
//     its container's plan; a container that drops them keeps the
//     daemon's.
//   - The daemon's defaults (set_default_device_pinned_mem_limit,
//     set_default_active_thread_percentage) apply to each client process of
//     the next server it starts; per-server limits
//     (set_device_pinned_mem_limit <pid>) to the later clients of a
//     running server; servers are per user (a client of another user waits
//     until the server of the first has no client left).
//   - Who may send a daemon those set_* commands through its control
//     socket, which every MPS client reaches: the 535 daemon takes them
//     from any user; the 580 daemon only from root and the user that
//     started it ("Insufficient privileges for UID 65534"). quit, and
//     servers for other users, are refused to other users by both
//     (TestClientCanChangeLimits).
//   - The pinned memory limit counts each client's own CUDA context, not
//     only its allocations: in a 1 GiB share on an H100 or an H200 (driver
//     580) a process allocates 448 MiB but not 512 MiB, in a 2 GiB share
//     1280 MiB but not 1536 MiB (internal/testing/hwtest's TestMPSShares).
//
// So gpuiso gives each share a daemon of its own, started by root with its
// limits, and builds on what a container cannot change: the GPU its daemon
// serves, the daemons it can reach (its own alone: no other share's pipe
// directory is in its mount namespace, and every registered manager's
// directory is masked in a native container's view of the host), and its
// memory as the allocator counts it. Concretely:
//
//   - enforced: a CUDA process of the container that uses MPS cannot
//     allocate past its share (cuMemAlloc fails with
//     CUDA_ERROR_OUT_OF_MEMORY; its context counts in the share), nor use
//     more than its compute percentage of the GPU's threads, nor reach
//     another GPU; no other share's daemon, server or limits are within its
//     reach; the shares of a GPU never add up to more than its memory. On
//     a 580 driver a container running as a user other than root cannot
//     change its daemon's limits either.
//   - per process, not per container: the memory limit is MPS's per client
//     process; a container that runs N CUDA processes can hold N times its
//     share.
//   - not enforced against a container that sets out to break it: one
//     running as root (on any driver; any user on the 535 driver) can send
//     its own daemon set_* commands and raise its own limits, up to the
//     GPU's free memory, taken from its neighbours; any container can run
//     CUDA without MPS (CUDA_MPS_PIPE_DIRECTORY pointing elsewhere), with
//     the whole GPU's memory. The GPU's compute mode (EXCLUSIVE_PROCESS
//     refuses CUDA without MPS, and a second daemon's server with it) is
//     the node administrator's; gpuiso never changes a GPU's settings.
//     [Manager.Held] tells whether a daemon's limits were changed. Memory
//     shares guard against frameworks that take every byte they see (the
//     Docker Swarm case), not against a tenant that attacks its
//     neighbours: give those whole GPUs or MIG devices.
//   - time slices (allocator.ShareTime) isolate nothing: the containers of
//     a GPU each see all of its memory and compute, and only the
//     allocator's count of them (allocator.WithTimeSlices) is enforced.
//   - concurrent slices (allocator.ShareSlice) are clients of one daemon
//     and one server: see below.
//
// # Concurrent slices
//
// A concurrent slice (allocator.Share, mode allocator.ShareSlice, Slices
// N) is one of N equal parts of one GPU. The slices of a GPU share one
// daemon ([Manager.StartSlice], through [Manager.StartShare]), recorded as
// [SliceOwner] of the GPU's UUID, with the slices' owners as its tenants:
// the first slice starts it, with the default limits of 1/N of the GPU
// (set_default_device_pinned_mem_limit of the GPU's memory divided by N,
// set_default_active_thread_percentage of 100/N rounded down), read back
// as a share's are; a later slice finds it running and only adds itself
// to its record (no command to the daemon: a slice's launch beside a
// running daemon costs what an exclusive launch does); [Manager.Stop] of a
// slice's owner drops it from the tenants and stops the daemon with the
// last. A MIG device is split as a GPU is: its slices' daemon is
// [SliceOwner] of its "MIG-" UUID, serves it alone, and divides its memory.
// The manager's lock orders starts, so that two slices started at
// once start one daemon. A sweep keeps the daemon while its allocator
// holds a slice of its GPU, or the caller keeps one of its tenants
// ([Keep]). Each slice's container gets the daemon's pipe directory and
// /dev/shm, and its defaults as CUDA_MPS_* in its environment.
//
// The two kinds side by side:
//
//   - a memory share has a daemon, a server and a /dev/shm of its own;
//     its limits are its own (any size, any compute percentage); the
//     servers of a GPU's shares time-slice among themselves; no share can
//     reach another's daemon, server or shared memory.
//   - concurrent slices run their kernels at once, as clients of one
//     server, each held to the daemon's default limits (1/N of the
//     GPU's memory, as each client process's pinned memory limit, and
//     100/N percent of its threads). The server is of one user: a slice
//     whose container runs as another user waits until the first user's
//     clients are done, so the slices of one GPU should run as one
//     user. What a tenant of a sliced GPU can do to its neighbours: its
//     processes are clients of the same server, so a fatal fault in one
//     of them (an illegal memory access, say) can end or corrupt the
//     work of every client of that server, its neighbours' included;
//     the limits are per client process, not per slice (a container
//     that runs several CUDA processes holds several times its part);
//     all slices share the daemon's control socket, so a tenant that
//     may send it set_* commands (root, or any user on the 535 driver)
//     changes the limits of the next server the daemon starts, its
//     neighbours' clients' too, and a tenant running as root can send
//     it quit, which ends it for every slice; they share one /dev/shm
//     and one pipe directory, where each can read, fill (up to the
//     tmpfs's bound) or remove what the others' processes put there.
//     Give concurrent slices to cooperating workloads of one tenant;
//     give tenants that must not disturb each other memory shares, MIG
//     devices or whole GPUs.
//
// The pipe and shared memory directories are the container's to write
// while its daemon runs, and the daemon and its servers, run by root,
// create, write and chmod files there by name (control_lock, log,
// control). Their mount namespace has both directories nosuid, nodev,
// noexec and nosymfollow, so a link the container plants by such a name
// fails the daemon rather than leading it to a host file; the manager
// itself reaches the sockets there through handles it opens without
// following a link, each checked to be a socket (ErrTampered). On a
// kernel without nosymfollow (before Linux 5.10) a new daemon's
// directories, which no container has seen yet, are bound as they are,
// and a dead daemon is not started again under its running container
// (ErrUnsafeRestart).
//
// Each share's server has a CUDA context of its own on the GPU, and the
// servers of one GPU's shares time-slice among themselves rather than run
// their kernels concurrently as the clients of one server do: the price of
// keeping shares out of each other's reach, which concurrent slices do not
// pay. Starting a daemon takes some
// 20 ms and stopping it as much (BenchmarkDaemon), which every share's
// launch and destruction pays (BenchmarkShareLaunch in
// containerizer/native).
//
// # Processes sharing a directory
//
// Every change takes the directory's lock (flock on .lock, a 0600 file in
// the 0700 directory: no other user can open it, let alone hold it) and an
// in-process turn, each waited for at most the lock timeout
// (WithLockTimeout; ErrLocked past it); List reads records written
// atomically and takes no lock. A daemon started by one process is stopped by any other: the
// records name processes by pid and start time, checked in the proc file
// system (WithProcRoot), so processes sharing a directory must share a pid
// namespace. A daemon runs in the session of its own and outlives the
// process that started it; Stop or Sweep, from any process, ends it.
package mps
