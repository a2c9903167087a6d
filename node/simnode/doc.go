// Package simnode simulates a GPU node, so that everything gpuiso does can be
// run and proven on machines without a GPU.
//
// A [Node] is built from a topology description ([Spec]); the shipped ones
// (see [Names]) are dgx1-volta, dgx1-pascal, dgx-a100, hgx-h100, dgx2,
// rtx8000x4 and pcie8. Its [Node.NVML] answers as the node's driver would,
// through go-nvml's mock types: stable UUIDs and bus ids, PCIe topology,
// NVLinks (NVSwitch systems link every GPU to the switches), memory and
// fingerprint attributes, and event sets. What a real driver could not
// answer, it answers with ERROR_NOT_SUPPORTED rather than a panic.
//
// Tests drive the node: [Node.InjectXID] delivers XID events to registered
// event sets, and [Node.Lose] makes a GPU fall off the bus (every call about
// it returns ERROR_GPU_IS_LOST, and watchers receive XID 79).
//
// [Node.MakeHost] creates, as root, the node's host tree in a directory of
// the caller's: /dev nodes with NVIDIA's minors on majors no driver of the
// host owns (nvidia<minor> and nvidiactl (minor 255) on one free major,
// nvidia-uvm and nvidia-uvm-tools on another), a /proc/devices naming those
// majors, the driver's /proc files and sysfs NUMA attributes. Opening a GPU
// node gives EPERM where the device cgroup denies it and something else
// (ENXIO: no driver answers) where it allows it, also on a host whose real
// NVIDIA driver owns major 195. It never writes into the real /dev.
//
// The simulated driver version is the host's installed NVIDIA user-space
// driver's when there is one (so simulated nodes and the real driver volume
// agree), else [FallbackDriverVersion]; [WithDriverVersion] sets it.
package simnode
