// Package isolator enforces GPU ownership: a container can open only the GPUs
// the allocator gave it.
//
// Its back ends share one contract, after Mesos' isolators: prepare a
// container (the device rules, device nodes, mounts and environment it must
// get, computed as plain data), isolate a process into it, update its GPUs
// while it runs, report usage, clean up, and recover from what the kernel
// still holds after a restart. The native back end drives the cgroup v1
// devices controller and the cgroup v2 eBPF device filter; the Docker back
// end injects devices and the driver volume into container configurations;
// isolator/cdi writes the node's GPUs as a Container Device Interface spec
// that any CDI runtime applies itself.
package isolator
