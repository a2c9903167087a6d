// Package chain is gpuiso's GPU isolator for agents that run containers
// themselves: one object with the hooks of an agent's isolation chain (as
// Mesos' isolator interface has them), so that an agent with its own
// runtime and its own CPU and memory isolators adds GPUs with it alone.
//
// # Hooks
//
// The agent calls, for each container:
//
//   - [Isolator.Prepare] before the launch: the GPUs are allocated (the one
//     prepare step of package containerizer: requirements, allocation,
//     driver volume, plan) and the [Launch] says what the container must
//     get: device nodes, the device cgroup allow list, mounts and
//     environment.
//   - [Isolator.Isolate] with the container's first process, before it runs
//     the command: the isolator makes the container's device cgroup with its
//     rules and moves the process in; or [Isolator.IsolateCgroup] with a
//     cgroup the agent made (on cgroup2, where a process has one cgroup,
//     the agent's CPU and memory cgroup itself).
//   - [Isolator.Update] to change the number of GPUs live, never letting a
//     GPU be reachable from two containers.
//   - [Isolator.Usage] for what the container's processes use of its GPUs.
//   - [Isolator.Cleanup] after the container is gone: idempotent.
//   - [Isolator.Recover] once, when the agent starts, with the containers it
//     still knows.
//
// Mesos' watch (a container's limitations) has no counterpart: the device
// cgroup refuses what is not allowed rather than reporting it.
//
// # Who owns what
//
// The allocator's state directory owns the allocations; the isolator's
// state directory ([Config].StateDir) holds one record per container (an
// entry of the record store of package containerizer/record), written
// Started, atomically, before anything is taken and Completed when Prepare
// returns, so that an agent killed at any point leaves nothing that
// Recover cannot find. [Isolator.Update] is the shared grow/shrink step
// (containerizer.Resize). The device cgroups
// under [Isolator.Parent] (derived from the state directory, see
// [CgroupParent]) are the isolator's: it makes them, kills their processes
// and removes them. A cgroup given to IsolateCgroup stays the agent's: the
// isolator writes its device rules and nothing else. The agent owns its
// processes, its other cgroups and its own record of which containers
// run. With [Config].MPS, a memory share's MPS control daemon is the
// isolator's too: Prepare starts it, Cleanup stops it, Recover keeps it
// (or starts it again in place) for a known container and stops the
// others; the launch's plan names its pipe directory and /dev/shm, which
// an agent whose containers have a mount namespace of their own binds
// (Launch.Plan.Mounts).
//
// One isolator at a time holds a state directory (New takes its lock,
// Close gives it up; a second New fails with ErrInUse at once), so that a
// restarted agent never races a live one over the same containers. The
// directory is private to the agent's user (0700) and its lock a 0600 file
// in it: one that another user owns, or could open, write or replace, is
// refused (ErrUnsafeLock), for that user could otherwise hold the lock, or
// the records, of every agent.
//
// # Recovery
//
// The kernel keeps a container's device rules while the agent is down, and
// the allocator's state keeps its GPUs. After a restart Recover holds the
// GPUs of every known container again (its allocation, or exactly the GPUs
// its record names where the allocator's state lost it) and applies its
// rules again; everything of the isolator's own that no known container
// explains is cleaned up. A known container it cannot hold GPUs for again
// (another owner took them while the allocator's state was lost) keeps
// running with every GPU denied, and is reported. Recover never touches
// another instance's cgroups, records or allocations, and never lists a
// nested parent as a container.
package chain
