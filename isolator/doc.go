// Package isolator decides what a container gets for its GPUs and hands it
// to the code that enforces it: a container can open only the GPUs the
// allocator gave it, and sees the driver as the plan says.
//
// # Plan
//
// [NewPlan] is the one derivation of what a set of GPUs brings. From the
// devices the allocator handed out (node.DeviceRef: whole GPUs and MIG
// devices, each with its device node as discovery found it) it computes,
// as plain data:
//
//   - the device nodes ([DeviceNode]): the driver's control nodes
//     (nvidiactl, nvidia-uvm, nvidia-uvm-tools; not nvidia-modeset), then
//     each device's nodes ([GPUNodes]): a GPU's /dev/nvidia<minor>; a MIG
//     device's parent node and the capability nodes of its GPU instance and
//     compute instance. Each is bound from the path the node model holds,
//     so the plan needs no dev root;
//   - the device rules ([Rule]), derived from those nodes ([DeviceRules]):
//     the runtime's defaults and "c <major>:<minor> rwm" per node;
//   - the mounts (such as the read-only driver volume) and the environment:
//     NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES naming every device of
//     the allocation (void for none), then what the caller adds. PATH-like
//     variables ([IsPathList]) hold the image's list with the plan's
//     directories added, never a list that drops the image's;
//   - with [WithCPUAffinity], the CPUs and memory nodes local to the GPUs
//     (Plan.CPUs and Plan.Mems): those of the NUMA nodes the GPUs hang
//     off, the union for GPUs on several, read from the host's
//     /sys/devices/system/node (the sys root is injectable). A GPU whose
//     NUMA node discovery could not tell pins nothing;
//   - for a memory share, with [WithShare], what an MPS client needs of the
//     share's control daemon (package isolator/mps) and nothing more: its
//     pipe directory at /tmp/nvidia-mps, its /dev/shm in place of the
//     container's, CUDA_MPS_PIPE_DIRECTORY and the share's client limits
//     (mps.Limits.Env).
//
// A plan reads nothing but that NUMA list and touches nothing; it is
// tested without root.
//
// # Renderers
//
// Each renderer turns a plan into a back end's form and decides nothing:
//
//   - isolator/oci edits an OCI runtime spec (the form runc, containerd and
//     CRI-O take, and the native containerizer builds on): device nodes, a
//     deny-all followed by the plan's rules, mounts, environment;
//   - isolator/dockerconfig computes a Docker container configuration: device
//     mappings (or, with NewCDI, a CDI device request), the plan's rules,
//     bind mounts, environment and labels recording the owner;
//   - isolator/cdi writes a Container Device Interface spec: per GPU the
//     nodes of that GPU's plan, and per allocation ([cdi.Render]) a device
//     holding the whole plan. CDI can only set variables, so its specs
//     leave PATH-like ones to the image.
//
// Rendered through any of them, one plan gives a container the same
// devices, rules, mounts and environment; a test renders one plan through
// all of them and compares.
//
// # Enforcers
//
// isolator/cgroups enforces a plan's rules on a running container's cgroup:
// the v1 devices controller (a pure transition from the rules it holds to
// the rules wanted, allows first) or the v2 eBPF device program (built by
// a pure function, attached in one atomic step). The runtimes (Docker, a
// CDI runtime, runc) enforce the renderings themselves.
package isolator
