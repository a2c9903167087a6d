// Package hwtest is gpuiso's hardware suite: the assertions that only a
// node with real NVIDIA GPUs and a loaded kernel driver can prove. It has no
// API; its tests are the product. They need the "gpu" suite (see
// internal/testing/testenv), which the project's full test command does not require,
// and skip with a reason elsewhere.
//
// On a GPU node the suite asserts that
//
//   - discovery (nvmlnode.Discover with its defaults) finds every GPU that
//     nvidia-smi -L lists, by UUID;
//   - every library in the driver volume's lib64 loads (dlopen, RTLD_NOW)
//     with the volume's own directories first on the search path;
//   - in a native container given one GPU, CUDA works (testdata/cudacheck:
//     cuInit, a context, an allocation, a memset and a copy back, verified)
//     and nvidia-smi -L lists exactly that GPU;
//   - in a native container given none, CUDA finds no device, no GPU node is
//     in its /dev before or after CUDA ran (its /proc shows the driver's
//     parameters with ModifyDeviceFiles: 0, so the driver's libraries make
//     none), and a device node the container makes itself (mknod) for a GPU
//     cannot be opened: EPERM from the device cgroup;
//   - a compute loop (cudacheck --spin: a kernel in PTX that the driver
//     compiles, its results verified) runs alone in an exclusive
//     container, in two memory shares of half the GPU at once, and in two
//     concurrent slices of it (Slices 2, one daemon) at once; the work per
//     second of each client, their sum and its ratio to the alone figure
//     are logged, not asserted; past half the GPU's memory allocates alone
//     but neither in a half share nor in a slice of 2, and a client run as
//     another user than root gets a server of its uid that is non-dumpable
//     (TestShareThroughput).
//
// It never changes a GPU's settings: no MIG mode, clocks, persistence or
// compute mode. A GPU in MIG mode is not chosen for the CUDA container.
//
// The suite ships as a bundle that needs neither Go nor Docker nor a
// registry on the GPU node: `make hwtest` builds, into hwbundle/, stripped
// test binaries (go test -c) of this package and of the suites worth running
// on real hardware (discovery, and the cgroup2 suites: the isolator, the
// native containerizer, the chain, the agent, gpurun, gpuiso-runtime, the
// conformance suite), the programs those suites run as scripts over their
// test binaries, runc, the static probe (testdata/probe), cudacheck built
// with gcc against libdl alone, run.sh, and a tarball of them all under 64
// MiB. `bash hwbundle/run.sh` (or `make hwrun`) runs it as root on the GPU
// node. The test binaries find the probe, cudacheck and the programs through
// GPUISO_PROBE, GPUISO_CUDACHECK and GPUISO_PROGRAM_DIR, which run.sh sets,
// or next to themselves.
//
// The cgroup2-only VM of internal/testing/vmtest runs the same cgroup2 suites from
// the same scripts (bundle.sh --vm, run.sh --vm), narrowed to its budget.
//
// Without a GPU the tests that can run anyway do: cudacheck is built with
// gcc and must report a missing driver or device cleanly, its --spin runs
// against a stand-in libcuda (testdata/cudacheck/fakecuda.c) that checks
// the launches and computes the kernel's results on the host, the host's
// driver volume must load, and the bundle is built and checked.
package hwtest
