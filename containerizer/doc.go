// Package containerizer runs containers through gpuiso's chain: the allocator
// decides which GPUs a container owns, the volume manager provides the
// driver, and an isolator enforces both, across launch, wait, update, destroy
// and recovery.
//
// [Containerizer] is the contract. Package native implements it with host
// processes in their own mount namespace and device cgroup (Mesos'
// cgroups/devices + gpu/nvidia isolation); package docker with containers of
// the Docker daemon, whose devices and driver volume gpuiso injects itself.
// [Composite] puts both behind the one interface: a [Spec] naming an image
// goes to Docker, any other to the native back end, and both draw on one
// allocator, so no GPU is ever handed out twice.
//
// Every back end owns, per container: the allocation named by the
// container's id, its isolation (cgroup, or Docker container), and its
// registration as a user of the driver volume; Destroy gives all of them
// back, and Recover finds them again after the agent restarts.
package containerizer
