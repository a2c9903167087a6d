// Package cdi renders a node's GPUs as a Container Device Interface spec
// (tags.cncf.io/container-device-interface), the form in which containerd,
// CRI-O, Podman, Docker 25+ and Kubernetes DRA drivers receive devices, and
// names an allocation's GPUs in it.
//
// # The spec
//
// [New] turns the node model ([node.Inventory]) into one spec per device
// kind ("vendor/class", default [DefaultKind] "nvidia.com/gpu", see
// [WithKind]):
//
//   - a device per healthy GPU named by its index ("3") and another named
//     by its UUID ("GPU-..."): the GPU's node at /dev/nvidia<minor> with the
//     major:minor the node model holds (node.Device.Node, which discovery
//     read from the device node itself), and NVIDIA_VISIBLE_DEVICES=<uuid>;
//   - the device [AllDevices] ("all") with every one of those nodes and
//     NVIDIA_VISIBLE_DEVICES listing every UUID;
//   - edits common to every device: the driver's control nodes (nvidiactl,
//     nvidia-uvm, nvidia-uvm-tools, as the inventory found them) and, with
//     [WithVolume], the driver volume read-only, nosuid, nodev at
//     /usr/local/nvidia with PATH and LD_LIBRARY_PATH (as volume's Injection
//     gives them to an image that sets neither).
//
// A GPU that is unhealthy, or whose device node or UUID is unknown, is not
// in the spec, so a runtime refuses its names. The spec's cdiVersion is the
// lowest that expresses it (the library's MinimumRequiredVersion: 0.5.0,
// for device names that begin with a digit and nodes with host paths), so
// older runtimes (Podman 4.3) read it too. MIG instances get devices of
// their own where the node model carries them (see migDevices in spec.go).
//
// CDI merges the environment of several devices by name: a container given
// two GPU devices sees the NVIDIA_VISIBLE_DEVICES of one of them. Ask for
// "all", or set the variable from the allocation, where that matters.
//
// # Writing
//
// A [Writer] keeps one file per kind, "<vendor>-<class>.json", in a spec
// directory ([DefaultDir] /var/run/cdi: generated specs live as long as the
// boot). [Writer.Write] is idempotent: a file that already holds the spec's
// bytes is not touched at all (same content, same modification time), so an
// agent may write on every start and every health event and runtimes that
// watch the directory see only real changes. A changed spec goes to a
// temporary file in the same directory, is synced, validated by the CDI
// library exactly as a runtime will read it, renamed over the old file, and
// the directory is synced; a spec the library refuses is a [*SpecError] and
// leaves the directory as it was. [ValidateFile] and [List] read specs the
// way runtimes do; List reports each bad file without hiding the others.
//
// # Names
//
// [AllocationNames] turns an allocator.Allocation into the fully qualified
// names a runtime takes ("nvidia.com/gpu=GPU-..."): by UUID, which names the
// same GPU whatever order NVML enumerates them in. isolator/docker's NewCDI
// hands them to a Docker daemon as a device request of the "cdi" driver.
//
// Nothing here needs root or a GPU except writing into a runtime's spec
// directory; the package never logs.
package cdi
