// Package conformance holds the recovery conformance suite: one set of
// cases run against every gpuiso runtime as the program its users run, and
// kill.
//
// # Subjects
//
// A subject is a runtime driven through its example program, built with
// the go command:
//
//   - native: examples/gpurun (containerizer/native, cgroup v1 devices);
//   - docker: examples/dockerrun (containerizer/docker, the host's Docker
//     daemon, an image FROM scratch around the test probe);
//   - chain: examples/agent (the GPU isolator chained after the agent's own
//     CPU and memory isolator, containerizer/chain).
//
// An instance of a subject is its own state directory (and TMPDIR) on a
// simulated DGX-1 (--simulate dgx1-volta); the processes of one instance
// share its allocator and compete for its eight GPUs. The suite reads only
// what a program leaves where anyone can see it: its state directory
// (records, the allocator's state file), cgroups, mounts, /proc, the Docker
// daemon's containers and their labels, the driver volume's users.
//
// # Cases
//
//   - random kills: runs of a short command SIGKILLed at a delay drawn
//     uniformly over the run's start-up, launch, run and destroy (up to 1.2
//     times as long as a batch of runs not killed takes on this host), a
//     few at a time; two starts that only recover, killed in their
//     recovery; then a start that only recovers and a run of all eight
//     GPUs. The seed is logged: GPUISO_CONFORMANCE_SEED replays the delays
//     (each subject draws from a source of its own; the window is measured
//     again), GPUISO_CONFORMANCE_KILLS sets the number of runs (default 10).
//   - side by side: two instances each run a container; one instance is
//     killed, three more of its starts are killed at random points, and it
//     is started again; the other's container keeps running and exits 0
//     when let go. A runtime that adopts what a killed run left (the chain)
//     still runs the first container; one that removes it (native, Docker)
//     has done so, and the start names no other container.
//   - neighbours: live processes in a cgroup of the shared default parent
//     and in a nested parent inside each of the instance's own parents,
//     another instance's running container (and, for Docker, a container
//     that is not gpuiso's): the instance's recovery after two kills leaves
//     them all running and returns within a bound.
//
// TestUpdateKillPoints kills inside Lifecycle.Update, where the native
// runtime grows or shrinks a running container: the test binary itself is
// the program (one Lifecycle, the native runtime, two containers), and it
// SIGKILLs itself at each point of a grow and of a shrink in turn (every
// step the update logs, before and after every application of device
// rules), on cgroup v1 and v2. After each kill a recovery in the test's
// own process must adopt both containers, each allowed exactly the GPUs
// the allocator holds for it (read-write opens of every GPU's node from
// inside its device cgroup: ENXIO where allowed, EPERM where denied), with
// exactly their nodes in its /dev and its record, no GPU allowed to both;
// Destroy of both then leaves nothing. The Lifecycle writes no CDI spec:
// a kill inside a CDI write is isolator/cdi's to test.
//
// TestChainKilledInCgroupDelete makes directly the state that a kill of
// the agent inside its cgroup removal leaves, which the random kills found.
//
// # Invariants
//
// Checked in every case: no GPU is allowed to two live containers of one
// instance at once, and the allocator holds every GPU a live container is
// allowed for that container (sampled while runs go, from each container's
// device cgroup and the allocator's state file); nothing of a dead run is
// left once the next start has run (no record, allocation, volume user,
// cgroup, mount, process, temporary tree or Docker container); no live
// neighbour is touched. Instances have allocators of their own: GPUs are
// exclusive within one.
//
// The sampler that checks the first two (Sampler, in a non-test file) is
// the package's one importable part: other suites watch their own
// containers with it (NewSampler, with a Watch of their live containers,
// GPUsAllowed for this host's device cgroup, HeldIn for an allocator's
// state file), as the gpuiso-runtime suite does through Podman, Docker and
// runc.
//
// The suite needs root, cgroup v1's devices controller, the NVIDIA
// user-space libraries (simulated nodes) and, for the docker subject, the
// host's Docker daemon; it skips with a reason otherwise, and fails instead
// under GPUISO_REQUIRE=all.
package conformance
