// Package containerizer runs containers through gpuiso's chain: the allocator
// decides which GPUs a container owns, the volume manager provides the
// driver, and an isolator enforces both, across launch, wait, update, destroy
// and recovery.
//
// [Containerizer] is the contract. Package native implements it with host
// processes in their own mount namespace and device cgroup (Mesos'
// cgroups/devices + gpu/nvidia isolation); package docker with containers of
// the Docker daemon, whose devices and driver volume gpuiso injects itself.
// One [Lifecycle] runs both at once (LifecycleConfig.Runtimes, at most one
// runtime per kind): a [Spec] naming an image goes to Docker, any other to
// the native runtime ([Route]), ids are unique across them, and both draw
// on the one allocator the Lifecycle is given, so no GPU is ever handed
// out twice.
//
// # One prepare step
//
// [Preparer.Prepare] is the chain every back end runs before it starts
// anything, so the back ends cannot drift (the owner id checked once
// before, at the Lifecycle's door): the image's
// NVIDIA_REQUIRE_* conditions on the driver, before anything is held (image
// labels and environment for Docker, Spec.Env natively); the allocation (a
// container asking for no GPU holds nothing, gets every GPU denied and
// NVIDIA_VISIBLE_DEVICES=void: a CPU job on a GPU node never reaches a GPU);
// the conditions on the allocated GPUs; for a memory share (Spec.GPUs.Share),
// its MPS control daemon (Preparer.MPS, package isolator/mps; refused with
// [ErrNoMPS] without one), whose pipe directory and /dev/shm the plan
// binds; the driver volume, only for a container with a root file system
// of its own whose image asks for it; and the isolation plan, the one maker
// of the devices' variables (NVIDIA_VISIBLE_DEVICES), with a share's MPS
// client limits; the container's whole environment is merged once there
// ([Prepared.Env]). [Prepared.Undo] gives everything back. A conformance
// suite runs the same cases against both back ends.
//
// # One lifecycle
//
// A container is launching (its id reserved while its launch runs),
// running, exited (its command ended; it keeps what it holds), or
// destroying. A Lifecycle keeps the containers of all its runtimes in one
// [Table], which allows only the changes of that life and refuses any other
// with a [*TransitionError] (matching [ErrTransition]). Destroy of a
// launching container is decided there, once: it waits for the launch to
// end, then destroys what the launch made, or nothing when the launch
// failed and undid itself. A second Destroy while one is at work is a
// transition error; a Destroy that fails leaves the container as it was,
// to be destroyed again.
//
// [Lifecycle] is that life over one or several [Runtime]s, which only
// create, start, wait for, kill, remove and list containers with their
// records: the Lifecycle owns the states, the launches in progress, the
// prepare step, the allocator (taken once) and the one recovery, which
// serves both an agent that restarted ([Lifecycle.Recover]: adopt what
// every runtime runs, claim its GPUs with allocator.Claim, give back what
// vanished, then reconcile the allocator once against the union of their
// containers, keeping what another live process holds) and a short-lived
// runner that died ([Lifecycle.Clean]: remove the containers of dead
// supervisors, claim those of live ones). A runtime can do more through optional
// interfaces: [Reserver] reserves the id durably before the prepare step
// (so that a process killed at any point leaves a reservation the next
// recovery removes with what its owner held), [Adopter] records the
// supervisor that takes over a dead one's container, [Cleaner] sweeps
// leftovers of its own after a recovery, [Updater] resizes a running
// container's GPUs, [Repairer] brings a container in line with the
// allocator after a kill inside an update, [UsageReader] and
// [TempDirMaker] answer [Lifecycle.Usage] and [Lifecycle.TempDir], and
// [Supervised] names the supervisor of its containers itself (the native
// runtime: the process that runs it). The containerizers of packages
// docker and native are Lifecycles over their runtimes (Docker containers
// and their labels; a state directory of records, cgroups and inits), so
// both recover the same way.
//
// # The allocator is the record
//
// What a container holds is what the allocator holds for its owner; the
// container's own record follows it. An update runs in the one order of
// [Resize] (a grow allocates, records, then allows; a shrink denies,
// releases, then records), so that a process killed at any step leaves the
// allocator holding every GPU the container may reach. Recover then claims
// what the allocator holds, has a [Repairer] runtime enforce that again
// (device rules and /dev nodes) and record it, and adopts the container
// whatever step it was killed at. A container it still cannot adopt (its
// record unreadable, its GPUs another's) is reported with a
// [*NotAdoptedError], of one kind (ErrNotAdopted, node.ErrInvalid), and
// Destroy of its id removes it and gives back what its owner holds, so no
// id is left that neither Recover nor Destroy settles.
//
// Every back end owns, per container: the allocation named by the
// container's id, its isolation (cgroup, or Docker container), its
// registration as a user of the driver volume, and a memory share's MPS
// daemon; Destroy gives all of them back (the daemon before the share), and
// Recover finds them again after the agent restarts: a record's share is
// claimed again as a share (allocator.Claim with AsShare, Record.Share), its daemon
// kept or started again in place, and the daemons no share or container
// explains are stopped.
//
// # Who cleans up what
//
// Every path that gives something back, in one place. Each is idempotent
// (what is already gone is not an error) and each leaves what it cannot
// give back held, never half given back, so that the next path finds it.
//
// In this package:
//   - [Lifecycle.Destroy] kills and removes the container, then its owner's
//     MPS daemon, allocation and volume use, then its reservation: a
//     running container's teardown.
//   - A failed [Lifecycle.Launch] removes what the runtime created, undoes
//     the prepare step ([Prepared.Undo], each step's undo in reverse:
//     daemon, plan, volume use, allocation) and drops the reservation.
//   - Destroy of an id the Lifecycle does not know removes what the
//     runtimes still list of it where no other live supervisor has it (a
//     container [Lifecycle.Recover] did not adopt, a killed launch's
//     reservation), with what its owner holds.
//   - [Lifecycle.Recover] removes the containers no one can use (a launch
//     killed before it started), reconciles the allocator against every
//     runtime's list ([allocator.Allocator.Reconcile]) and stops the MPS
//     daemons no share, container or launch explains
//     ([mps.Manager.Sweep]).
//   - [Lifecycle.Clean] removes the containers of provably dead
//     supervisors and gives back what their owners hold, and claims for
//     live supervisors what the allocator lost.
//
// In the runtimes and isolators:
//   - The native runtime's Sweep (after Clean and Recover) removes the
//     claim and temporary directories of dead processes and the cgroups no
//     record explains, in its own cgroup parent only.
//   - The chain isolator's Cleanup gives back one container's device
//     cgroup, allocation, volume use and record; its Recover cleans up
//     every record and cgroup no known container explains.
//   - gpuiso-runtime's delete gives back a container's GPUs and volume use
//     once runc no longer reports it alive, and settles the other records
//     of its state directory.
//   - The DRA driver's Unprepare releases a claim's devices, removes its
//     CDI spec and then its checkpoint.
//
// Below them, each owner of a resource:
//   - [allocator.Allocator.Release] gives back one owner;
//     [allocator.Allocator.ReleaseDead] every owner whose holder is provably
//     dead; [allocator.Allocator.Reconcile] every owner not named live.
//   - The volume manager's Release drops one use of a version; its GC
//     removes the volumes no one uses and what crashed builds left.
//   - [mps.Manager.Stop] stops one owner's daemon; Sweep every daemon a
//     keep predicate does not keep, and what killed commands left.
//   - The CDI writer's Sweep removes the temporary files of writers that no
//     longer run.
package containerizer
