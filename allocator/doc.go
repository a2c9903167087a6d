// Package allocator decides which container owns which GPU of a node.
//
// # The model
//
// [Discover] reads, once, what the node has: an [Inventory] of [Device]
// values (identity, model, memory, NUMA node, health and Nomad-style
// fingerprint [Attributes]), the [Topology] linking every pair of GPUs (PCIe
// level and NVLink count; NVSwitch systems are one all-to-all group) and the
// driver's control device nodes. NVML (github.com/NVIDIA/go-nvml) is loaded
// at run time, so one binary serves nodes with and without GPUs: on a node
// without the library Discover fails with an error matching
// [ErrLibraryNotFound], on one whose kernel driver is not loaded with
// [ErrDriverNotLoaded]. A GPU NVML cannot read (for instance one that fell off
// the bus) is reported unhealthy with the reason, beside the others.
//
// Placement works on the inventory alone and never calls NVML again.
//
// # Host paths
//
// Discover reads the dev root (/dev), proc root (/proc) and sys root (/sys);
// each can be moved to a test tree with [WithDevRoot], [WithProcRoot] and
// [WithSysRoot]. Package simnode builds a complete simulated node (NVML and
// host tree) for tests and demos on machines without a GPU.
package allocator
