// Package docker runs GPU containers through the Docker daemon's API, with
// gpuiso's allocator, driver volume and Docker isolator: the devices and the
// driver are injected by the containerizer itself, so no NVIDIA runtime hook
// is needed on the daemon's host.
//
// [Runtime] is the daemon as a containerizer.Runtime: it creates, starts,
// waits for, stops, removes and lists (by their labels) the containers of
// its namespace. [Containerizer] is a containerizer.Lifecycle over it, which
// owns the rest: the states and the launches in progress, the prepare step,
// the allocator and the recovery ([New] builds both).
//
// # Launch
//
// Launch inspects the image first (its labels and
// environment; an image's configuration may be empty) and decides there,
// before anything is created or held for good, whether the container gets
// the driver volume (the com.nvidia.volumes.needed label, or
// NVIDIA_VISIBLE_DEVICES set) and whether the driver meets the image's
// NVIDIA_REQUIRE_* requirements: an image the driver cannot serve is refused
// with an error matching volume.ErrRequirementUnmet, and no container is
// created and no GPU held. The requirements that concern the GPUs themselves
// (arch, brand) are checked on the GPUs the allocator chose, which are
// released again when they fail. The container is then created with the
// Docker isolator's configuration (package isolator/dockerconfig: device mappings
// with "rwm", the volume read-only at /usr/local/nvidia, the environment)
// and labels recording its owner, its GPUs, the volume and the
// containerizer's namespace; its output is demultiplexed onto the spec's
// writers from an attach made before it starts, so none is lost (standard
// input is not passed: a spec with Stdin is refused). A spec asking for no
// GPU gets the control devices only and holds nothing in the allocator.
// The container's network is Docker's "none", a namespace of its own with
// only a loopback interface, as a native container's, unless Spec.Network
// is containerizer.NetworkHost; it never joins the daemon's bridge. An
// image the daemon does not have is an error matching node.ErrNotFound.
//
// With [WithCDI] the GPUs go to a daemon that speaks CDI (API 1.44 or later
// with CDI enabled, Docker 25+) as one device request of the "cdi" driver
// naming them in the node's CDI spec (isolator/cdi; the node keeps it
// written), and their nodes come from that spec; other daemons get device
// mappings as without it. The daemon is asked once; every container records
// the choice in the io.gpuiso.injection label ("cdi" or "devices").
//
// # Lifecycle
//
// Wait returns the exit status (128+N for a signal) once the output is
// copied. Destroy stops (after a grace period) and removes the container,
// releases its GPUs and its use of the volume. Update returns an error
// matching containerizer.ErrNotSupported and changes nothing: the daemon
// cannot change the device rules of a created container (moby #42255), so
// the Runtime is no containerizer.Updater. Destroy the container and launch
// it again with the new count instead.
//
// # Recovery
//
// Everything needed to find a container again is in its labels and the
// allocator's durable state. Recover, run by a new containerizer over the
// same daemon and allocator state, lists the containers of its namespace,
// re-adopts each with its GPUs (allocator.Claim: its recorded devices again
// where the allocator lost them), and releases what
// it held for containers that vanished; it also reconciles the allocator
// against the live containers, releasing the GPUs of containers that
// vanished while no containerizer ran, but never those another live
// process holds (see containerizer.Lifecycle.Recover). Output writers are
// not re-attached. [NewRuntime] is the runtime alone, for a Lifecycle over
// it and other runtimes (native ones) and one allocator.
//
// A program that runs containers only while it lives (dockerrun) names
// itself their supervisor with [WithSupervisor]: each container carries
// the process in [LabelSupervisor], and its GPUs are held with the process
// as holder. Clean is that program's recovery: it removes
// the namespace's containers whose supervisor is provably dead, gives back
// their GPUs and volume uses and those of owners whose holder died, and
// claims (allocator.Claim) the GPUs of the containers of live supervisors,
// so that a lost allocator state cannot hand them out again. Recover leaves
// a live supervisor's containers to it (their GPUs claimed, not adopted);
// those of a dead one it adopts, as an agent that restarted expects.
//
// When the daemon does not answer, calls fail with a [*DaemonError]
// (matching [ErrDaemonUnavailable]) and change nothing; once it is back,
// the same calls, or Recover, succeed. A daemon without live-restore stops
// its containers when it stops: they are found exited, keep their GPUs
// until destroyed, and Wait reports how they ended.
//
// The containerizer never logs unless given a logger with [WithLogger].
package docker
