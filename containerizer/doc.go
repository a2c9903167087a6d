// Package containerizer runs containers through gpuiso's chain: the allocator
// decides which GPUs a container owns, the volume manager provides the
// driver, and an isolator enforces both, across launch, wait, update,
// destroy and recovery, natively or through Docker, behind one interface.
package containerizer
