// Package dra is gpuiso's Dynamic Resource Allocation driver for the
// kubelet (resource.k8s.io/v1, on
// k8s.io/dynamic-resource-allocation/kubeletplugin).
//
// # The slice
//
// Devices computes, as plain data, the devices of the node's ResourceSlice:
// every whole GPU ("gpu-<index>") and every MIG device of a
// GPU split by MIG ("mig-<index>-<gi>-<ci>"; its parent is then not
// published whole, as the allocator hands such a GPU out only by its MIG
// devices). Each carries attributes a CEL selector can use, in the driver's
// domain (type, uuid, index, minor, model, productName, brand,
// architecture, computeCapability, driverVersion, cudaDriverVersion,
// numaNode, migCapable, and for MIG devices profile, parentUUID,
// gpuInstance, computeInstance), the standard resource.kubernetes.io
// pciBusID, pcieRoot and numaNode, and capacity (memory, and
// multiprocessors for MIG devices). nvlinkClique partitions the whole GPUs
// into groups that are NVLinked pairwise (NVLinkCliques), so that a claim
// for several GPUs with a matchAttribute constraint on it gets directly
// connected GPUs. An unhealthy device carries a taint (see Health); the
// slice changes when health does, and the caller publishes it again.
//
// # Shares of a GPU
//
// A GPU that SliceOptions.Shared names (the program's --shared-gpus) is
// published as memory shares only, never whole: one device
// "share-<index>" of type "share" (the DeviceClass share.gpuiso.io selects
// it) with allowMultipleAllocations and its memory as consumable capacity
// (KEP-5075, beta and on in Kubernetes 1.37), whose request policy gives
// each claim at least ShareMin (default 1 GiB), in steps of ShareStep
// (default 256 MiB) above it, and ShareMin when it asks for no memory. The
// scheduler allocates several claims shares of it while their memory fits,
// each with a share id and the memory it consumed; a claim that does not
// fit stays pending until another share is freed. A claim asks for one:
//
//	requests:
//	- name: gpu
//	  exactly:
//	    deviceClassName: share.gpuiso.io
//	    capacity: {requests: {memory: 8Gi}}
//
// Prepare reads the result's share id and consumed memory, and the
// compute percentage of the driver's opaque configurations that apply to
// the request (ShareConfig: the class's, then the claim's). It holds a
// memory share (allocator.Share) of the GPU under the claim's owner,
// starts the share's MPS control daemon (package isolator/mps: one per
// share, for that GPU alone, its limits set before any client can
// connect), and writes the claim's CDI spec with the GPU's nodes, the
// daemon's pipe directory at /tmp/nvidia-mps and its /dev/shm
// (isolator.WithShare), CUDA_MPS_PIPE_DIRECTORY and the limits in the
// environment. The checkpoint records the share and its id.
// Unprepare stops the daemon, then releases the share. A claim holds one
// share and no other device of the driver (ErrShareClaim). What a share
// enforces, and what it does not, is isolator/mps's to say: the memory
// limit holds each MPS client process of the pod; a pod that sets out to
// break it can.
//
// A claim's GPUConfig may ask for another kind of share of the same
// device: a time slice (sharing.strategy TimeSlicing: the GPU whole,
// beside the GPU's other time slices, no MPS daemon; at most the
// allocator's time-slice count per GPU) or a concurrent slice
// (strategy MPS with mps.slices N: one of N slices, held by the GPU's one
// MPS daemon, which its slices share, to 1/N of the GPU's memory and
// threads; mps.Manager.StartShare starts it with the first slice and
// Stop drops each, stopping it with the last). The allocator holds
// either as such (allocator.ShareTime, allocator.ShareSlice) and the
// checkpoint records the kind, so that a restart holds the same again. A
// GPU holds shares of one kind at a time, which the scheduler cannot see
// (it reads no opaque configuration, and a slice consumes the memory its
// request asks for, as a memory share does): a claim allocated a GPU
// that holds another kind is refused at Prepare by the allocator.
//
// # Dynamic MIG
//
// A GPU with MIG enabled that SliceOptions.DynamicMIG names (the
// program's --dynamic-mig: every GPU with MIG enabled) is partitioned on
// demand, as partitionable devices (KEP-4815, beta and on in Kubernetes
// 1.37). Its slice side (partitionDevices, CounterSets) is a counter set
// "gpu-<index>" of its memory slices ("memory-slice-<k>", 1 each), its
// compute slices ("compute-slices") and, for a profile the GPU holds
// fewer instances of than it has placements (one 1g.10gb+me of seven
// places), that count ("profile-<id>"); and devices that consume them:
// every placement of every profile, "mig-<index>-<profile>-<start>" (type
// "mig", its profile, parentUUID, placementStart and placementSize, its
// memory and multiprocessors, no uuid until it is made), and the GPU
// whole, "gpu-<index>", which consumes everything. The scheduler so never
// allocates overlapping placements, nor the GPU whole beside any of them.
// A MIG device on the GPU that the driver did not make (a user's) is
// published as it is and never touched; the slices it covers are left out
// of the counters, the placements it overlaps are not published, nor is
// the GPU whole. An unhealthy partitioned GPU's devices carry its health
// taint as other devices do (or are left out without taints); no MIG
// device is made on it. The API server takes devices or counter sets in
// a slice, not both: PoolSlices puts the counter sets in slices of their
// own (8 each) and the devices in slices of 64 when one of them consumes
// counters or has taints (128 otherwise).
//
// Prepare of a claim allocated a placement records it in the claim's
// checkpoint (PreparedDevice.MIG: the GPU, profile and placement), then
// makes the GPU instance and its compute instance at that placement and
// holds the MIG device under the claim's owner in one step
// (allocator.AllocateMIGAt, through the allocator's MIG manager: NVML's,
// or the simulated node's), records its UUID and instance ids, and writes
// the claim's CDI spec of the new device (its parent's node, its
// capability nodes, NVIDIA_VISIBLE_DEVICES naming it). Unprepare releases
// it, which destroys it. A claim of the GPU whole holds it as a GPU
// (allowed by the allocator only while the GPU has no MIG device at all,
// and no MIG device is made on it meanwhile). The request's GPUConfig (its
// MIG profiles) is checked before anything is made. A claim holds one
// dynamic MIG device and no other device of the driver, and no admin access
// to one (ErrMIGClaim). Restore keeps the devices of prepared claims (held
// again, standing for their placements in the slice), rolls back a
// preparation cut short that recorded a placement (destroying its device if
// it was made, even if the allocator had not recorded it yet: the unheld
// device at the placement is taken over first, and a GPU instance without
// a compute instance there goes to Config.MIGDestroyer), and releases,
// destroying what was made for it, an owner of claims the allocator still
// has with no checkpoint left.
//
// # Prepare and unprepare
//
// A Driver prepares a claim's devices of this driver by holding them in the
// node's allocator under the owner "claim-<uid>" (so a GPU is never
// prepared for two claims, and an unhealthy one only for a claim that
// tolerates its taint), computing their
// isolator.Plan, and writing it as the claim's own CDI spec
// (cdi.Render, Writer.WriteAllocation): one CDI device,
// "<driver>/claim=alloc-claim-<uid>", with every device node and the
// environment naming exactly the claim's devices.
//
// Each prepared claim has its own checkpoint file in the state directory,
// "<uid>.json": an entry of the core's record store (package
// record, the one every durable file of the core uses), written
// atomically (temporary file, sync, rename, directory sync), versioned
// (format "gpuiso-dra-claim", version 3; the files of versions 1 and 2,
// written before the store, are read still) and checksummed. It is
// written PrepareStarted (the record's phase Started) before
// anything is done and PrepareCompleted after. A completed claim is
// answered from its checkpoint (prepare is idempotent and survives a
// restart); a started one was cut short by a crash and is rolled back
// (allocator hold, CDI spec, checkpoint) before it is prepared again. A
// failure rolls back what the call did. Unprepare rolls back a claim and
// is no error for a claim it does not know. A corrupt checkpoint is
// reported (ErrCorruptCheckpoint) and left as it is; so is one that names
// an owner other than "claim-<uid>", whose rollback would release another
// owner's GPUs.
//
// # Concurrency
//
// The kubelet's calls are not serialised (kubeletplugin.Serialize(false)
// in the program): the driver orders them itself. One operation at a time
// works on a claim; the node's state (the allocator's hold, MIG devices
// made, MPS daemons, the claim's CDI spec, rollbacks) is changed by one
// claim at a time, under one lock, while the claims' checkpoint writes
// (the started and completed marks, each synced to disk) run outside it
// and overlap. The order of each claim's steps, and so what a crash
// leaves, is the same as before: the started mark is on disk before the
// hold, the completed mark after the spec.
//
// A claim's CDI spec is written without syncs to disk (cdi.Writer.NoSync;
// its removal is still synced): it lives in a directory emptied at boot,
// and the checkpoint, synced, is what a restart trusts. After a machine
// crash the spec may be missing, empty or older; Restore, before the
// plugin registers, and Prepare write it again from the checkpoint
// whenever it differs, as they do after a reboot.
//
// # Metrics
//
// A Driver tells Config.Observer of every prepare and unprepare of a
// claim as it ends (Event): its result, its duration from the call
// (waits for other operations included) and the duration of each step (StepWait, StepRead, StepRestore,
// StepStarted, StepAllocate, StepSpec, StepCompleted, StepRollback). The
// package does not depend on a metrics library; the program turns events
// into Prometheus counters and histograms. The same timings go to the
// logger with each "prepared claim" and "unprepared claim" line.
//
// # Extended resources, admin access, configuration
//
// A DeviceClass of whole GPUs with extendedResourceName: nvidia.com/gpu
// (KEP-5004, GA in 1.37) serves a pod's resources.limits through DRA: the
// scheduler writes the pod a claim of that many devices of the class. Such
// a claim carries no constraint (no matchAttribute), and the scheduler's
// allocator takes the first devices of a slice that fit; so the slice's
// order is how the claim gets NVLinked GPUs. Driver.Resources lists the
// whole GPUs of the NVLink clique with the most free GPUs first, its free
// GPUs before the ones the allocator holds or a taint marks
// (PreferredOrder); the program publishes the slice again after every
// prepare and unprepare. A request for n GPUs then gets n of one clique
// whenever a clique has n free; a claim that must have them asks with a
// matchAttribute on nvlinkClique.
//
// A request with adminAccess: true (KEP-5018; the API server allows it in
// a namespace labelled resource.kubernetes.io/admin-access=true) is
// allocated devices that other claims may hold. Prepare gives such a
// device to the claim's CDI spec (its nodes, the control nodes, and
// NVIDIA_VISIBLE_DEVICES naming it) without holding it in the allocator:
// the owner's hold is untouched, and unpreparing the admin claim releases
// nothing (PreparedDevice.Admin in its checkpoint). An admin claim of a
// shared GPU gets the GPU's nodes, not a memory share or an MPS daemon.
//
// Opaque configurations of the driver are read for every request it
// prepares (ParseDeviceConfig): the versioned GPUConfig (apiVersion
// "<driver>/v1") with a sharing strategy (Exclusive, MPS), MPS limits and
// the MIG profiles a request accepts, decoded strictly, and the older
// ShareConfig. One that does not read, or does not hold for the devices
// its request was allocated (MPS for a whole GPU, a MIG device of a
// profile not listed), fails the claim's preparation with a *ConfigError
// (ErrInvalidDeviceConfig) naming the field; the kubelet reports it as the
// pod's FailedPrepareDynamicResources event.
//
// # Reboots
//
// The checkpoints and the allocator's state live on disk that survives a
// reboot (under /var/lib); the claims' CDI specs live in /var/run/cdi,
// which the node empties at boot. After a reboot the kubelet starts the
// containers of a prepared claim again, and may do so before it asks to
// prepare the claim, or without asking. So the spec is never taken on
// trust: Restore, called when the plugin starts and before it registers
// with the kubelet, writes the spec of every completed claim again, and
// Prepare does the same for a completed claim it is asked about. Each
// renders the spec from the checkpoint's devices as the allocator holds
// them (allocator.Claim: a hold it lost is taken again, or refused when
// another owner has the device now) and writes it when the file is
// missing or its content differs; an intact file is left untouched.
//
// A share's MPS daemon runs in a session of its own and outlives a
// plugin killed with SIGKILL (or its pod, rolled). Restore and Prepare
// give a completed share its daemon again (mps.Manager.StartShare: a running
// one is kept, a dead one started again in the directories its pods have
// mounted) and its share (allocator.Claim with AsShare); Restore then stops every
// daemon that no checkpoint explains. A share cut short (PrepareStarted)
// is rolled back, daemon first, by its next Prepare or Unprepare.
//
// # Health
//
// An unhealthy GPU or MIG device (as the allocator has it: marked by the
// NVML health monitor or by any gpuiso program of the node) stays in the
// slice with a taint (KEP-5055) of key TaintKey ("gpu.gpuiso.io/unhealthy"),
// whose value is a short form of the reason and whose effect follows the
// health table's action (HealthTaintOf):
//
//	restart-app, drain (XID 63, 92, an NVLink down, ...)   NoSchedule
//	reset-gpu, reboot, the node resetting its GPUs          NoExecute
//	  (SliceOptions.EvictForReset)
//	reset-gpu, reboot otherwise: where the work is dead     NoExecute
//	  (XID 48, 62, 64, 79, 95, 119, 120: NoExecuteXIDs; a
//	  double-bit ECC event; the GPU lost), else (XID 74,
//	  109, a recovery action, ...)                          NoSchedule
//	any other reason (an operator's)                        by the reason, as above
//
// With EvictForReset, the node's health monitor resets such a GPU once no
// claim holds it (nvmlnode.WithReset): the NoExecute taint evicts the
// claims' pods, the GPU is reset and published untainted, or, its reset
// failed, keeps a NoExecute taint (action reboot).
//
// A MIG device of an unhealthy GPU carries its parent's taint, a shared
// GPU's share device the GPU's. The scheduler allocates a tainted device
// to no claim that does not tolerate the taint, and the cluster's device
// taint eviction controller evicts the pods whose claims hold a NoExecute
// one. The taint goes when the device is healthy again. A device in
// service with a signal noted on it (allocator.Inform: an XID whose fix is
// restarting the application, a slowdown) carries a taint of the same key
// with effect None: shown, never keeping a claim from it.
// Config.LeaveOutUnhealthy leaves unhealthy devices out of the slice
// instead, for a cluster without device taints.
//
// Prepare hands an unhealthy device to a claim only when the claim's
// allocation tolerates every taint the device has now (the result's
// tolerations: an operator's diagnostic claim): it asks the allocator for
// exactly those devices although unhealthy (allocator.Request's
// AcceptUnhealthy), and for the others as always. A claim holding an
// unhealthy device it does not tolerate is refused (ErrUntolerated),
// and every unhealthy device is refused with LeaveOutUnhealthy.
//
// WatchHealthStatus reports health to the kubelet (KEP-4680): a first
// report of every device in the node's pool (Config.NodeName), Healthy or
// Unhealthy with the reasons as message, then one whenever NotifyHealth
// finds it changed and the same again every Config.HealthResend (default
// 10 s, within the kubelet's 30 s health timeout). The kubelet shows it in
// the pod's status.containerStatuses[].allocatedResourcesStatus, by the
// claim's CDI device.
//
// The driver never logs unless given a *slog.Logger.
package dra
