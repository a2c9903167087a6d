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
//     by its UUID ("GPU-..."), holding the nodes of that one GPU as
//     isolator.GPUNodes derives them (the nodes a plan of that GPU holds):
//     /dev/nvidia<minor> with the major:minor the node model holds; the
//     same per MIG device of a split GPU ("<index>:<gi>:<ci>" and its
//     "MIG-..." UUID), with its parent's node and its two capability nodes;
//   - the device [AllDevices] ("all") with every one of those nodes and
//     NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES listing every UUID;
//   - edits common to every device: the driver's control nodes (nvidiactl,
//     nvidia-uvm, nvidia-uvm-tools, as the inventory found them) and, with
//     [WithVolume], the driver volume read-only, nosuid, nodev at
//     /usr/local/nvidia.
//
// A GPU that is unhealthy, or whose device node or UUID is unknown, is not
// in the spec, so a runtime refuses its names. The spec's cdiVersion is the
// lowest that expresses it (the library's MinimumRequiredVersion: 0.5.0,
// for device names that begin with a digit and nodes with host paths), so
// older runtimes (Podman 4.3) read it too.
//
// # The environment
//
// CDI can only set a variable, and merges the variables of several devices
// by name, the last one winning. So a GPU's device sets none (two of them
// would leave the container one GPU's NVIDIA_VISIBLE_DEVICES), and no spec
// sets PATH or LD_LIBRARY_PATH (isolator.IsPathList): setting them would
// replace the image's directories instead of adding to them. An image
// that runs the driver's tools lists /usr/local/nvidia/bin and
// /usr/local/nvidia/lib64 itself, as CUDA images do.
//
// An allocation's environment comes with the allocation's own device:
// [Render] turns an isolator.Plan into a spec of one device,
// [AllocationDevice] ("alloc-<owner>"), holding every node, mount and
// variable of the plan (PATH-like ones left out), and
// [Writer.WriteAllocation] puts it beside the node's spec and returns its
// name in [Result].Names. Given that name, a CDI runtime creates the
// container the plan describes: NVIDIA_VISIBLE_DEVICES and
// CUDA_VISIBLE_DEVICES name every device of the allocation. A spec that
// does not define the owner's device is refused: the name would resolve to
// nothing.
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
// leaves the directory as it was. A temporary file is named after the
// process writing it, so that a writer killed in the middle leaves nothing
// for good: each write that changes a file, and [Writer.Sweep], removes the
// temporary files of writers that no longer run. A Writer never writes to
// a relative directory ([ErrInvalidDir]). [ValidateFile] and [List] read specs the
// way runtimes do; List reports each bad file without hiding the others.
//
// # Names
//
// [Names] turns devices into the fully qualified names of their GPU
// devices ("nvidia.com/gpu=GPU-..."): by UUID, which names the same GPU
// whatever order NVML enumerates them in. isolator/dockerconfig's NewCDI hands
// them to a Docker daemon as a device request of the "cdi" driver, and
// sets the allocation's environment in the container's configuration.
// [AllocationNames] names an allocation's GPUs in the node's spec; a GPU
// without a UUID, which the spec leaves out, is an error
// ([ErrUnresolvable]) rather than a name that resolves to nothing. A
// write's [Result].Names are the names of what it wrote.
//
// Nothing here needs root or a GPU except writing into a runtime's spec
// directory; the package never logs.
package cdi
