// Package cgroups is gpuiso's native isolator back end: it confines each
// container to the devices of its allow list with the kernel's device
// cgroup, version 1 (the devices controller) or version 2 (an eBPF device
// program).
//
// Each container (owner) gets the cgroup <parent>/<owner> (parent "gpuiso" by
// default) under the devices controller's or the cgroup2 mount. The isolator
// owns that cgroup: its rules, its device program and its removal. Programs
// that run their own containers should not share a parent: the native
// containerizer (package containerizer/native) moves an isolator left on
// the default parent to one of its state directory's own, and [Owners]
// never lists a child that is itself a parent of cgroups.
//
// Rule changes on a live cgroup never open a window in which every device is
// denied: on v1 only the difference against devices.list is written, then the
// list is read back and verified; on v2 the container's single device program
// is replaced atomically (BPF_F_REPLACE), never stacked, so updates can widen
// as well as narrow access and never run into the kernel's limit of 64
// programs. The v2 rule list is kept on the cgroup itself (an extended
// attribute), so that, as with v1's devices.list, the kernel holds everything
// recovery after a restart needs.
//
// containerd/cgroups provides the mode detection and the eBPF device filter;
// the v1 rules are written here, because its v1 devices controller rewrites
// the whole list on every update.
//
// [Isolator.SetCPUs] pins a container to CPUs and memory nodes (a plan's
// CPUs and Mems): on cgroup2 the cpuset controller of the same cgroup,
// enabled from the root down to the parent; on v1 a cgroup of the same name
// in the cpuset hierarchy, which AddProcess, Destroy and RemoveParent then
// handle with the device cgroup.
//
// [New] picks the version from the host (cgroups.Mode(): unified means v2,
// hybrid and legacy mean v1, whose devices controller they have), or takes
// one with [WithVersion].
package cgroups
