// Package deviceplugin serves a node's GPUs to the kubelet through the
// device-plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1).
//
// # Resources
//
// Resources turns the node model into the extended resources a pod asks for:
// every whole GPU (one not split by MIG) under the configured name
// (default "nvidia.com/gpu"), named by its "GPU-" UUID, and every MIG device
// under a resource of its profile in the same domain
// ("nvidia.com/mig-1g.10gb"), named by its "MIG-" UUID. A device carries its
// health and NUMA node.
//
// # Lifecycle
//
// A Manager serves one Plugin (one gRPC server on its own unix socket in the
// kubelet's device-plugin directory) per resource and registers each with
// the kubelet's Registration service (kubelet.sock in the same directory).
// When the kubelet restarts it deletes every socket there and creates
// kubelet.sock again: the Manager sees that and serves and registers every
// plugin again. When the Manager itself restarts, it removes its own stale
// sockets and registers anew; the kubelet keeps the devices of running pods.
// Each socket is 0600 whatever the process's umask (only root, the
// kubelet, may connect): it is bound in a private directory, given its
// mode there and renamed into place.
//
// # Health
//
// ListAndWatch streams a resource's devices and sends the list again
// whenever a device's health changes, both ways: Manager.Refresh reads the
// devices' health from the Source (the allocator, which nvmlnode.Monitor
// marks) and pushes a new list to every stream when anything changed.
//
// # Placement and allocation
//
// GetPreferredAllocation answers with gpuiso's topology-aware placement (the
// allocator's PolicyTopology run on the kubelet's available devices, with the
// ones it must include). Allocate answers each container with the CDI names
// of its devices (the node's spec, written by the caller with isolator/cdi),
// the environment naming them (NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES)
// and, with Config.DeviceSpecs, the device nodes themselves for runtimes
// that do not read CDI.
//
// # Holding what it hands out
//
// With a Keeper source (the allocator, shared with the DRA driver of the
// same node), Allocate holds each whole GPU and MIG device it hands out
// for its DeviceOwner, in the same step that refuses one a claim holds
// (ErrHeld): a GPU goes to a pod of the device plugin or to a claim,
// never both. The device-plugin API never says when a pod ends:
// Manager.Reconcile asks the kubelet's pod-resources service which
// devices its pods still hold and gives the others back (leaving those
// just handed out for Config.TimeSliceGrace). Manager.Adopt holds, at
// start, what the kubelet's pods hold already: the devices an earlier
// run handed out, or those of a device plugin since turned off (a Manager
// need not Run to Adopt and Reconcile).
//
// # Time slices
//
// For clusters without DRA, GPUs named in Config.Shared are served as
// time slices instead of whole, as NVIDIA's time-slicing replicas: each as
// Config.Replicas devices "<uuid>::<k>" under Config.SharedResourceName
// (default "nvidia.com/gpu.shared"), so that that many pods asking for one
// each run on the GPU together. Allocate holds each replica handed out as
// a time slice in the allocator (allocator.ShareTime, owner
// "timeslice-<uuid>-<k>"), so that a GPU with time slices goes to no DRA
// claim, whole or shared, and a GPU a claim holds gives no replica; the
// container gets the GPU as a whole one's would. Reconcile and Adopt
// treat replicas as they treat whole devices.
//
// Time slices isolate nothing: every pod of a GPU sees all of its memory
// and compute, and may take all of either from the others. Only their
// number per GPU is enforced. Memory shares, enforced by MPS, are the DRA
// driver's.
//
// # Concurrent slices
//
// With Config.Strategy StrategyMPS the same replicas are concurrent
// slices, enforced by MPS, as the DRA driver's slices are: each GPU's
// Config.Replicas replicas (2 to allocator.MaxSlices) are its N equal
// slices. Allocate holds a replica as allocator.ShareSlice with Slices N
// for its ConcurrentSliceOwner ("mpsslice-<uuid>-<k>"), and makes sure its
// GPU's one MPS daemon runs (Config.MPS, an mps.Manager:
// mps.Manager.StartShare starts it with the GPU's first slice, with the
// default limits of 1/N of the GPU's memory and threads, and records each
// slice among its tenants). The container gets the GPU as a time slice's
// does, the daemon's pipe directory and /dev/shm as mounts (at
// isolator.MPSPipeDir and isolator.MPSShmDir) and CUDA_MPS_PIPE_DIRECTORY
// and the daemon's limits in its environment, as isolator.WithShare
// renders a DRA slice's. Reconcile gives a slice back once no pod holds
// it, its daemon first (mps.Manager.Stop of the tenant: the daemon stops
// with the GPU's last slice). Adopt holds the slices of running pods again
// with their daemons (a running daemon is kept, a dead one started again
// in place) and stops every daemon of Config.MPS that no slice held in
// the allocator explains, so that a restarted plugin kills no daemon its
// pods use and leaves none that nothing uses. Config.MPS should be a
// directory of the device plugin's own: the DRA driver sweeps its own by
// its claims.
//
// A container asking for more than one concurrent slice is refused
// (ErrSliceCount), as NVIDIA's device plugin refuses more than one MPS
// replica: the daemon holds each client process to one slice's limits
// whatever the container was given. The allocator keeps a GPU to one kind
// of share and one count of slices: a GPU with time slices gives no
// concurrent slice and the reverse. A GPU whose slices of the same count a
// DRA claim holds gives no replica either (ErrHeld): those have the DRA
// driver's daemon, and a second would serve the GPU beside it; the other
// way round, the DRA driver's slice taints a GPU the device plugin holds
// (dra.HeldTaint). What concurrent slices enforce and
// what they do not (the limits are per client process; the slices of a
// GPU share one server, one control socket and one /dev/shm) is in
// package isolator/mps: give them to cooperating workloads of one tenant.
//
// The package never logs unless given a *slog.Logger.
package deviceplugin
