// Package allocator decides which container owns which GPU of a node.
//
// # The model
//
// The allocator works on a node.Inventory (package node: devices, topology,
// control devices), which package nvmlnode discovers through NVML and
// package simnode simulates. Placement works on the inventory alone and never
// calls NVML. The package needs no cgo and builds for any GOOS.
//
// # Allocation
//
// [New] builds an [Allocator] over an inventory: the single truth of which
// owner (a container id, later part of cgroup paths, so checked by
// node.ValidateOwner) holds which GPU. [Allocator.Allocate] takes a [Request]:
// a count, explicit devices (index, UUID or bus id), or both; a model
// ("nvidia/gpu/<model>"), Nomad-style [Constraint]s and weighted
// [Affinity]s on device attributes ("memory >= 16 GiB", units compared in
// base units); a quota group ([WithQuota]); or, on GPUs made shareable with
// [WithShared], a [Share] of one GPU (see Shares below). [Allocator.Release],
// [Allocator.Resize] (a live update), [Allocator.Owners] and
// [Allocator.Allocations] (copies) complete it. Every change is all or
// nothing: no GPU is held twice, an unhealthy GPU is never handed out, a
// failed call changes nothing. Errors are typed: [InsufficientError],
// [QuotaError], node.InvalidOwnerError, and sentinels such as
// [ErrUnknownOwner], [ErrUnknownDevice], [ErrDuplicateDevice],
// [ErrDeviceUnavailable] and [ErrInvalidRequest].
//
// # MIG
//
// A GPU with MIG enabled is handed out only by its MIG devices, never whole
// or shared; a whole GPU has no instances. A request with Request.MIG (a
// profile, "1g.10gb") or Request.MIGMemoryBytes (the smallest devices of at
// least that memory), or naming "MIG-" UUIDs in Devices, gets Count MIG
// devices (default 1) on GPUs matching its model and constraints. Placement
// packs: each device goes to the parent with the most MIG devices already
// held, then (best fit) the one with the fewest left free, so whole parents
// stay free. The allocation's Devices are the parents' references with the
// devices' "MIG-" UUIDs and a node.MIGRef each (instance ids and capability
// nodes); NVIDIA_VISIBLE_DEVICES names the MIG UUIDs. Quotas count a parent
// once per group however many of its devices the group holds (as for
// shares); MarkUnhealthy takes a "MIG-" UUID for one device, and a GPU's
// owners include those of its MIG devices; MIG holdings and health are in
// the state file (optional fields, so older files load unchanged). Resize
// and Retain refuse MIG allocations. With [WithMIGManager] (off by default;
// simnode provides one for simulated nodes) a profile the layout cannot serve
// gets MIG devices created on GPUs with MIG enabled and room, destroyed again
// on release; a request that fails part way destroys what it created.
// [Allocator.AllocateMIGAt] creates one at a placement the caller chose (a
// scheduler that counts each GPU's memory slices decides where it goes),
// with a manager that is a [MIGPlacer]. With a MIG manager, a GPU with MIG
// enabled and no MIG device at all may also be held whole by a request
// that names it; no MIG device is created on it meanwhile, and it is not
// handed out whole while it has one.
//
// # Shares
//
// A [Share] is part of one GPU, in one of three modes. A memory share
// ([ShareMemory]: bytes, optionally a compute percentage) is counted
// against the GPU's memory and enforced by an MPS control daemon (package
// isolator/mps, which derives its limits from the share, mps.LimitsOf, and
// gives its container the client limits too, which a client can only
// lower). A time slice ([ShareTime]) is the
// whole GPU beside the GPU's other time slices, isolated from none of them;
// at most [WithTimeSlices] of them (default [DefaultTimeSlices]) share one
// GPU. A concurrent slice ([ShareSlice], Share.Slices N from [MinSlices] to
// [MaxSlices]) is one of N equal parts of one GPU, whose containers run at
// once as clients of one MPS control daemon that holds each to 1/N of the
// GPU's memory and compute (package isolator/mps); the allocator sets its
// memory (the GPU's divided by N) in the Allocation, and a GPU split in N
// holds at most N slices, all of count N. A GPU is held by one exclusive
// owner, by memory shares, by time slices or by concurrent slices of one
// count, never two of these at once. Placement packs: a share goes to the
// fullest GPU of its mode (and count) with room, and opens a GPU no one
// holds (chosen by the policy, as for a 1-GPU request) only when none has;
// whole-GPU requests take shareable GPUs last. A share that fits nowhere now is a
// [*ShareError] (kind node.ErrInsufficient) naming each GPU's free memory
// or why it cannot take it; one no GPU of the node could ever take is
// refused as such: [ErrShareNotSupported] on a node with no shareable GPU,
// [ErrInvalidRequest] for more memory than any shareable GPU has. A
// GPU with MIG enabled is never shared whole; its MIG devices are, as GPUs
// are: a [Request] with Share beside a MIG selection (MIG,
// MIGMemoryBytes, or one MIG device in Devices) asks for a share of one
// MIG device, whose own memory its shares divide; a MIG device holds one
// owner whole or shares of one mode, never both, and one that holds shares
// is not handed out whole. Quotas count a shared GPU (the parent of a
// shared MIG device) once per group.
// Shares are in the state file with their mode, compute and count; after a crash
// [Allocator.Claim] with [AsShare] re-holds the share a container's record
// names.
//
// # Placement
//
// [PolicyTopology], the default, chooses the set with the highest link
// score (NVLink 100 per link, PCIe 10 across sockets up to 60 on one board,
// summed over the set's pairs), exactly for nodes of up to 16 GPUs: a branch
// and bound over the free GPUs with precomputed pair scores, which takes
// microseconds. Ties go to the set with the least link to the free GPUs left
// behind, then to the lowest positions, so decisions are deterministic. A
// 1-GPU request takes the GPU whose strongest link to another free GPU is
// weakest, so NVLink pairs stay whole. [PolicyPack] fills a NUMA node and a
// PCIe switch before the next (best fit); [PolicySpread] spreads across NUMA
// nodes.
//
// # Health
//
// [Allocator.MarkUnhealthy] and [Allocator.MarkHealthy] take a GPU out of and
// back into service; its owners keep it and are returned, to be told.
// nvmlnode.Monitor does the same from NVML's XID and double-bit ECC
// events, ignoring the XIDs of application faults (13, 31, 43, 45, 68, 109),
// and calls back with the owners affected. One lost GPU never stops
// placement on the others.
//
// # Durable state
//
// With [WithStateDir], every change is in the state file ([StateFile])
// before the call returns: written to a temporary file in the same
// directory, synced, renamed over the old file, and the directory synced.
// The file is JSON with a format name, a version and a SHA-256 checksum. New
// loads it; a truncated, corrupt or foreign file fails New with a
// [StateError] naming it (matching [ErrCorruptState]) and is left as it is,
// never silently reset. After a crash, [Allocator.Reconcile] takes the
// owners the isolators still see and releases every other.
//
// # One state directory, many processes
//
// A state directory may be shared by any number of allocators, in one
// process or in many (on Linux). Every change takes an exclusive flock on
// [LockFile] in the directory, reads the state file again when it differs
// (by SHA-256) from what this allocator last read or wrote, applies the
// change, writes the file atomically and lets go; reads take no lock and see
// the last complete file. Temporary files carry their writer's pid, and only
// those of writers that provably died are removed. The cost is one
// read-and-hash of the state file beside the fsynced write, so the rate is
// the disk's fsync rate: BenchmarkSharedStateDir measures Allocate+Release
// pairs a second from 1 process and from 4 together on one directory (on a
// shared 2-core host with ext4 it gave from 140 to 900 a second, depending
// on the load of the host's other users; the lock serialises the fsyncs).
// Processes sharing a directory must share a pid namespace.
//
// No wait for the lock outlasts the caller's context: a change whose context
// ends first fails with a [LockError] (matching [ErrLocked] and the
// context's error) naming the holder, the process that wrote its pid and
// start time into the lock file on taking the lock, with its command name.
// New never waits: with the lock held elsewhere it reads the last complete
// state file and leaves the removal of dead writers' files to a later New.
//
// No other user can take the lock: [LockFile] is opened without following
// a link and only when it is a regular file of the allocator's user with
// no permission for group or others (made 0600 when missing), in a state
// directory of that user that no other user may write to (a missing one is
// made 0700; others may read an existing one, as no other user can open the
// 0600 files in it). Anything else fails New with an [UnsafeLockError]
// (matching [ErrUnsafeLock]) and is left as it is: another user may hold
// such a file open, and its lock with it, whatever its mode becomes, so it
// is never taken over; whoever runs the allocators removes it. Lock files
// of older releases (0600, the allocator's user's) are used as they are, so
// allocators of both releases exclude each other through an upgrade.
//
// An owner may name a [Holder] in its [Request]: the process (pid and start
// time, field 22 of /proc/<pid>/stat) whose life the allocation lasts.
// [Allocator.ReleaseDead] releases the owners whose holder provably died
// (pid gone, reused by a later process, or a zombie) and never a live one
// or one without a holder. Release a dead holder's GPUs only once its
// container's processes are gone; the containerizers do that themselves
// (native: Containerizer.Clean).
//
// # Node attributes
//
// The node's GPUs as schedulers filter nodes by them (Mesos agent
// attributes, Kubernetes node labels) are package node/attributes'; give it
// the inventory with the allocator's [Allocator.Devices] for their health.
package allocator
