// Package vmtest is the cgroup2-only VM step of gpuiso's full test command.
//
// # Why
//
// Real GPU nodes run the unified cgroup hierarchy alone (systemd in unified
// mode, as on current Ubuntu and RHEL and every managed Kubernetes image);
// the project's test host is hybrid (cgroup v1 controllers, and a cgroup2
// with none). Every cgroup2-only path (the native containerizer's, the
// chain's, the agent's cgroup2 branch, gpuiso-runtime under runc's v2
// device filter, the recovery conformance suite) would otherwise first run
// on a user's node. TestCgroup2VM runs them on such a kernel, in a VM, as
// part of `make test`; on a cgroup2-only host it skips (the suites run
// natively there).
//
// # The machine
//
// qemu-system-x86_64 under TCG (KVM is not usable on the test host), with
// Debian's own kernel booted directly (the uncompressed ELF through PVH,
// seconds faster than the bzImage) and the command line
// cgroup_no_v1=all: no v1 hierarchy exists, cgroup2 is mounted at
// /sys/fs/cgroup with nsdelegate and offers cpuset, cpu, io, memory,
// hugetlb, pids, rdma and misc. Two vCPUs on two NUMA nodes (a memory
// backend each), so that pinning a container to its GPUs' NUMA node is
// checked against a real second node. .ci/vm-kernel.sh (run by
// provision.sh) fetches the kernel and a static busybox from their .debs
// once into DefaultKernelDir; nothing is installed.
//
// # The guest
//
// [Initramfs] builds the initramfs in Go (a newc cpio: [Archive]): busybox,
// the init (init.sh), the virtio console and 9p modules in dependency order
// ([LoadOrder], read from each module's .modinfo, as the .deb has no
// modules.dep), a copy of the host's /etc and the guest's settings. The
// init builds the real root on a tmpfs (runc's pivot_root cannot leave an
// initramfs): the host's /usr shared read-only over 9p (the host's
// programs and libraries, NVIDIA's user-space driver included, so dynamic
// test binaries and /bin/sh run unchanged), the shares of [Guest] (the test
// bundle, the source tree), then runs the guest's command on the console
// and powers off. The console is qemu's standard output ([Machine.Run]
// hands each line over); the kernel's log goes to a file.
//
// # The suites
//
// internal/testing/hwtest's bundle.sh --vm builds the cgroup2 suites' test binaries
// (go test -c: the isolator, the native containerizer with its escape and
// boundary tests, the chain, the agent, gpurun, gpuiso-runtime with the
// bundle's runc, the conformance suite) and run.sh --vm runs them as root
// in the guest, the same script the hardware bundle runs on a GPU node,
// narrowed to fit the step's budget. What is left out is listed in
// README.md. The test logs the step's duration and each part of it.
package vmtest
