/*
 * cudacheck: does CUDA work here? The hardware suite runs it inside GPU
 * containers. It loads libcuda.so.1 at run time (no CUDA toolkit, no headers:
 * it links against libdl alone) and, on every device CUDA reports, creates a
 * context, allocates device memory, sets it with cuMemsetD8 and copies it
 * back, verifying every byte.
 *
 *   cudacheck                  the CUDA check; one line on stdout, exit code:
 *                                0 ok, 3 no libcuda, 4 no device,
 *                                5 cuInit failed otherwise, 1 a later step failed
 *   cudacheck --dlopen FILE... dlopen each FILE (RTLD_NOW); one line each,
 *                              "FILE ok" or "FILE error: ..."; exit 0 when all load
 *   cudacheck --alloc MIB [WAIT]
 *                              on device 0, allocate MIB MiB of device memory
 *                              (and set it); one line, "cudacheck: alloc MIB MiB:
 *                              ok" or "...: failed: ...", exit 0 or 6 (1 for a
 *                              step before the allocation); with WAIT, hold the
 *                              allocation until the file WAIT exists
 *   cudacheck --spin SECONDS [WAIT]
 *                              on device 0, run a compute loop for SECONDS
 *                              seconds: a kernel (PTX below, compiled by the
 *                              driver) of SPIN_BLOCKS blocks of SPIN_THREADS
 *                              threads, each thread SPIN_ITERATIONS dependent
 *                              integer multiply-adds, launched and waited for
 *                              again and again; then one line, "cudacheck:
 *                              spin L launches R it/s ...", where R is the
 *                              multiply-adds of all threads of all L launches
 *                              over the seconds from the first launch to the
 *                              end of the last, exit 0 (1 for a failed step,
 *                              a wrong result included); with WAIT, it first
 *                              prepares (context, kernel, memory), says
 *                              "cudacheck: spin ready" and starts only once
 *                              the file WAIT exists
 *
 * Build: gcc -O2 -o cudacheck cudacheck.c -ldl
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum {
	EXIT_OK = 0,
	EXIT_STEP = 1,
	EXIT_USAGE = 2,
	EXIT_NO_LIBCUDA = 3,
	EXIT_NO_DEVICE = 4,
	EXIT_INIT = 5,
	EXIT_ALLOC = 6,
};

/* The few driver-API types used, as the CUDA driver API defines them. */
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;
typedef int CUjit_option;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_NO_DEVICE 100
#define CU_JIT_ERROR_LOG_BUFFER 5
#define CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6

static struct {
	CUresult (*Init)(unsigned int);
	CUresult (*DeviceGetCount)(int *);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*DeviceGetName)(char *, int, CUdevice);
	CUresult (*CtxCreate)(CUcontext *, unsigned int, CUdevice);
	CUresult (*CtxDestroy)(CUcontext);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
	CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
	CUresult (*GetErrorName)(CUresult, const char **); /* optional */
	/* --spin alone */
	CUresult (*ModuleLoadDataEx)(CUmodule *, const void *, unsigned int, CUjit_option *, void **);
	CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*ModuleUnload)(CUmodule);
	CUresult (*LaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
				 unsigned int, unsigned int, CUstream, void **, void **);
	CUresult (*CtxSynchronize)(void);
} cu;

/* The compute loop of --spin: thread i of the grid sets x = i, then n times
 * x = x * 1664525 + 1013904223 (mod 2^32), each step depending on the last,
 * and stores x at buf[i], so that no step can be left out. PTX ISA 7.0
 * (CUDA 11) for sm_50: the driver compiles it for the device it runs on. */
static const char spin_ptx[] =
	".version 7.0\n"
	".target sm_50\n"
	".address_size 64\n"
	"\n"
	".visible .entry spin(\n"
	"	.param .u64 spin_buf,\n"
	"	.param .u32 spin_n\n"
	")\n"
	"{\n"
	"	.reg .pred %p<2>;\n"
	"	.reg .b32 %r<8>;\n"
	"	.reg .b64 %rd<5>;\n"
	"\n"
	"	ld.param.u64 %rd1, [spin_buf];\n"
	"	ld.param.u32 %r1, [spin_n];\n"
	"	cvta.to.global.u64 %rd2, %rd1;\n"
	"	mov.u32 %r2, %ctaid.x;\n"
	"	mov.u32 %r3, %ntid.x;\n"
	"	mov.u32 %r4, %tid.x;\n"
	"	mad.lo.s32 %r5, %r2, %r3, %r4;\n"
	"	mov.u32 %r6, %r5;\n"
	"	mov.u32 %r7, 0;\n"
	"	setp.eq.u32 %p1, %r1, 0;\n"
	"	@%p1 bra SPIN_DONE;\n"
	"SPIN_LOOP:\n"
	"	mad.lo.s32 %r6, %r6, 1664525, 1013904223;\n"
	"	add.s32 %r7, %r7, 1;\n"
	"	setp.lt.u32 %p1, %r7, %r1;\n"
	"	@%p1 bra SPIN_LOOP;\n"
	"SPIN_DONE:\n"
	"	mul.wide.u32 %rd3, %r5, 4;\n"
	"	add.s64 %rd4, %rd2, %rd3;\n"
	"	st.global.u32 [%rd4], %r6;\n"
	"	ret;\n"
	"}\n";

/* The grid of --spin: 4 blocks of 256 threads for each of an H100's 132
 * multiprocessors, each thread SPIN_ITERATIONS steps (some milliseconds a
 * launch on an H100). */
enum {
	SPIN_BLOCKS = 132 * 4,
	SPIN_THREADS = 256,
	SPIN_ITERATIONS = 1 << 20,
};

/* spin_expect is what the kernel stores for thread i. */
static uint32_t spin_expect(uint32_t i, uint32_t n)
{
	uint32_t x = i;
	for (uint32_t k = 0; k < n; k++)
		x = x * 1664525u + 1013904223u;
	return x;
}

static const char *errname(CUresult r)
{
	const char *s = NULL;
	if (cu.GetErrorName == NULL || cu.GetErrorName(r, &s) != CUDA_SUCCESS || s == NULL)
		return "unnamed";
	return s;
}

static int dlopen_each(int n, char **files)
{
	int failed = 0;
	for (int i = 0; i < n; i++) {
		void *h = dlopen(files[i], RTLD_NOW | RTLD_LOCAL);
		if (h == NULL) {
			const char *e = dlerror();
			printf("%s error: %s\n", files[i], e ? e : "unknown");
			failed = 1;
			continue;
		}
		printf("%s ok\n", files[i]);
		dlclose(h);
	}
	return failed ? EXIT_STEP : EXIT_OK;
}

/* load resolves name in lib into *fn; it reports a missing symbol. */
static int load(void *lib, void *fn, const char *name)
{
	void *sym = dlsym(lib, name);
	if (sym == NULL) {
		printf("cudacheck: no libcuda: libcuda.so.1 lacks %s\n", name);
		return -1;
	}
	memcpy(fn, &sym, sizeof sym);
	return 0;
}

/* step reports a failed driver call on device dev and says whether r failed. */
static int step(CUresult r, const char *call, int dev)
{
	if (r == CUDA_SUCCESS)
		return 0;
	printf("cudacheck: failed: device %d: %s returned %d (%s)\n", dev, call, r, errname(r));
	return 1;
}

static int check_device(int i, size_t size, unsigned char *host)
{
	CUdevice dev;
	CUcontext ctx = NULL;
	CUdeviceptr ptr = 0;
	int rc = EXIT_STEP;

	if (step(cu.DeviceGet(&dev, i), "cuDeviceGet", i) ||
	    step(cu.CtxCreate(&ctx, 0, dev), "cuCtxCreate_v2", i))
		return EXIT_STEP;
	if (step(cu.MemAlloc(&ptr, size), "cuMemAlloc_v2", i))
		goto out;
	memset(host, 0, size);
	if (step(cu.MemsetD8(ptr, (unsigned char)(0xa5 ^ i), size), "cuMemsetD8_v2", i) ||
	    step(cu.MemcpyDtoH(host, ptr, size), "cuMemcpyDtoH_v2", i))
		goto out;
	for (size_t k = 0; k < size; k++) {
		if (host[k] != (unsigned char)(0xa5 ^ i)) {
			printf("cudacheck: failed: device %d: byte %zu copied back as 0x%02x, want 0x%02x\n",
			       i, k, host[k], (unsigned char)(0xa5 ^ i));
			goto out;
		}
	}
	rc = EXIT_OK;
out:
	if (ptr != 0)
		cu.MemFree(ptr);
	cu.CtxDestroy(ctx);
	return rc;
}

/* alloc allocates mib MiB on device 0 and sets them; with wait, it holds
 * them until the file wait exists. */
static int alloc(unsigned long mib, const char *wait)
{
	CUdevice dev;
	CUcontext ctx = NULL;
	CUdeviceptr ptr = 0;
	if (step(cu.DeviceGet(&dev, 0), "cuDeviceGet", 0) || step(cu.CtxCreate(&ctx, 0, dev), "cuCtxCreate_v2", 0))
		return EXIT_STEP;
	size_t size = (size_t)mib << 20;
	CUresult r = cu.MemAlloc(&ptr, size);
	if (r != CUDA_SUCCESS) {
		printf("cudacheck: alloc %lu MiB: failed: cuMemAlloc_v2 returned %d (%s)\n", mib, r, errname(r));
		cu.CtxDestroy(ctx);
		return EXIT_ALLOC;
	}
	if ((r = cu.MemsetD8(ptr, 0x5a, size)) != CUDA_SUCCESS) {
		printf("cudacheck: alloc %lu MiB: failed: cuMemsetD8_v2 returned %d (%s)\n", mib, r, errname(r));
		cu.MemFree(ptr);
		cu.CtxDestroy(ctx);
		return EXIT_ALLOC;
	}
	printf("cudacheck: alloc %lu MiB: ok\n", mib);
	fflush(stdout);
	while (wait != NULL && access(wait, F_OK) != 0)
		usleep(10000);
	cu.MemFree(ptr);
	cu.CtxDestroy(ctx);
	return EXIT_OK;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* spin runs the compute loop on device 0 for seconds seconds; with wait,
 * once ready, it starts when the file wait exists. */
static int spin(unsigned long seconds, const char *wait)
{
	CUdevice dev;
	CUcontext ctx = NULL;
	CUmodule mod = NULL;
	CUfunction fn = NULL;
	CUdeviceptr buf = 0;
	const unsigned int threads = SPIN_BLOCKS * SPIN_THREADS;
	const size_t size = (size_t)threads * sizeof(uint32_t);
	uint32_t *host = NULL;
	int rc = EXIT_STEP;

	if (step(cu.DeviceGet(&dev, 0), "cuDeviceGet", 0) || step(cu.CtxCreate(&ctx, 0, dev), "cuCtxCreate_v2", 0))
		return EXIT_STEP;
	char log[4096] = "";
	CUjit_option opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
	void *vals[2] = {log, (void *)(uintptr_t)(sizeof log - 1)};
	CUresult r = cu.ModuleLoadDataEx(&mod, spin_ptx, 2, opts, vals);
	if (r != CUDA_SUCCESS) {
		log[sizeof log - 1] = '\0';
		for (char *c = log; *c; c++)
			if (*c == '\n')
				*c = ' ';
		printf("cudacheck: failed: device 0: cuModuleLoadDataEx returned %d (%s): %s\n", r, errname(r), log);
		mod = NULL;
		goto out;
	}
	if (step(cu.ModuleGetFunction(&fn, mod, "spin"), "cuModuleGetFunction", 0) ||
	    step(cu.MemAlloc(&buf, size), "cuMemAlloc_v2", 0))
		goto out;
	if ((host = malloc(size)) == NULL) {
		printf("cudacheck: failed: out of host memory\n");
		goto out;
	}
	unsigned int n = SPIN_ITERATIONS;
	void *params[] = {&buf, &n};
	if (wait != NULL) {
		printf("cudacheck: spin ready\n");
		fflush(stdout);
		while (access(wait, F_OK) != 0)
			usleep(1000);
	}
	unsigned long launches = 0;
	double start = now(), elapsed = 0;
	do {
		if (step(cu.LaunchKernel(fn, SPIN_BLOCKS, 1, 1, SPIN_THREADS, 1, 1, 0, NULL, params, NULL), "cuLaunchKernel", 0) ||
		    step(cu.CtxSynchronize(), "cuCtxSynchronize", 0))
			goto out;
		launches++;
		elapsed = now() - start;
	} while (elapsed < (double)seconds);
	if (step(cu.MemcpyDtoH(host, buf, size), "cuMemcpyDtoH_v2", 0))
		goto out;
	const unsigned int probes[] = {0, threads / 2 + 7, threads - 1};
	for (size_t k = 0; k < sizeof probes / sizeof probes[0]; k++) {
		uint32_t want = spin_expect(probes[k], n);
		if (host[probes[k]] != want) {
			printf("cudacheck: failed: device 0: the kernel's thread %u stored 0x%08x, want 0x%08x\n",
			       probes[k], host[probes[k]], want);
			goto out;
		}
	}
	double rate = (double)launches * threads * n / elapsed;
	printf("cudacheck: spin %lu launches %.0f it/s over %.3f s (%d blocks of %d threads, %u iterations each)\n",
	       launches, rate, elapsed, SPIN_BLOCKS, SPIN_THREADS, n);
	rc = EXIT_OK;
out:
	free(host);
	if (buf != 0)
		cu.MemFree(buf);
	if (mod != NULL)
		cu.ModuleUnload(mod);
	cu.CtxDestroy(ctx);
	return rc;
}

/* number parses s, a whole number above 0, into *v. */
static int number(const char *s, unsigned long *v)
{
	char *end;
	*v = strtoul(s, &end, 10);
	return *s != '\0' && *s != '-' && *end == '\0' && *v > 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--dlopen") == 0)
		return dlopen_each(argc - 2, argv + 2);
	unsigned long mib = 0, seconds = 0;
	const char *wait = NULL;
	if (argc > 1 && strcmp(argv[1], "--alloc") == 0 && (argc == 3 || argc == 4)) {
		char *end;
		mib = strtoul(argv[2], &end, 10);
		if (*argv[2] == '\0' || *end != '\0' || mib == 0) {
			fprintf(stderr, "cudacheck: --alloc %s: want a number of MiB above 0\n", argv[2]);
			return EXIT_USAGE;
		}
		if (argc == 4)
			wait = argv[3];
	} else if (argc > 1 && strcmp(argv[1], "--spin") == 0 && (argc == 3 || argc == 4)) {
		if (!number(argv[2], &seconds) || seconds > 3600) {
			fprintf(stderr, "cudacheck: --spin %s: want a number of seconds from 1 to 3600\n", argv[2]);
			return EXIT_USAGE;
		}
		if (argc == 4)
			wait = argv[3];
	} else if (argc > 1) {
		fprintf(stderr, "usage: cudacheck [--dlopen FILE... | --alloc MIB [WAIT] | --spin SECONDS [WAIT]]\n");
		return EXIT_USAGE;
	}

	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		const char *e = dlerror();
		printf("cudacheck: no libcuda: %s\n", e ? e : "dlopen libcuda.so.1");
		return EXIT_NO_LIBCUDA;
	}
	if (load(lib, &cu.Init, "cuInit") || load(lib, &cu.DeviceGetCount, "cuDeviceGetCount") ||
	    load(lib, &cu.DeviceGet, "cuDeviceGet") || load(lib, &cu.DeviceGetName, "cuDeviceGetName") ||
	    load(lib, &cu.CtxCreate, "cuCtxCreate_v2") || load(lib, &cu.CtxDestroy, "cuCtxDestroy_v2") ||
	    load(lib, &cu.MemAlloc, "cuMemAlloc_v2") || load(lib, &cu.MemFree, "cuMemFree_v2") ||
	    load(lib, &cu.MemsetD8, "cuMemsetD8_v2") || load(lib, &cu.MemcpyDtoH, "cuMemcpyDtoH_v2"))
		return EXIT_NO_LIBCUDA;
	if (seconds > 0 &&
	    (load(lib, &cu.ModuleLoadDataEx, "cuModuleLoadDataEx") || load(lib, &cu.ModuleGetFunction, "cuModuleGetFunction") ||
	     load(lib, &cu.ModuleUnload, "cuModuleUnload") || load(lib, &cu.LaunchKernel, "cuLaunchKernel") ||
	     load(lib, &cu.CtxSynchronize, "cuCtxSynchronize")))
		return EXIT_NO_LIBCUDA;
	void *sym = dlsym(lib, "cuGetErrorName");
	memcpy(&cu.GetErrorName, &sym, sizeof sym);

	CUresult r = cu.Init(0);
	if (r == CUDA_ERROR_NO_DEVICE) {
		printf("cudacheck: no device: cuInit returned %d (%s)\n", r, errname(r));
		return EXIT_NO_DEVICE;
	}
	if (r != CUDA_SUCCESS) {
		printf("cudacheck: init failed: cuInit returned %d (%s)\n", r, errname(r));
		return EXIT_INIT;
	}
	int n = 0;
	if ((r = cu.DeviceGetCount(&n)) != CUDA_SUCCESS) {
		printf("cudacheck: failed: cuDeviceGetCount returned %d (%s)\n", r, errname(r));
		return EXIT_STEP;
	}
	if (n == 0) {
		printf("cudacheck: no device: cuDeviceGetCount found 0 devices\n");
		return EXIT_NO_DEVICE;
	}
	if (mib > 0)
		return alloc(mib, wait);
	if (seconds > 0)
		return spin(seconds, wait);

	const size_t size = 1 << 20;
	unsigned char *host = malloc(size);
	if (host == NULL) {
		printf("cudacheck: failed: out of host memory\n");
		return EXIT_STEP;
	}
	char names[512] = "";
	for (int i = 0; i < n; i++) {
		int rc = check_device(i, size, host);
		if (rc != EXIT_OK) {
			free(host);
			return rc;
		}
		char name[128] = "?";
		CUdevice dev;
		if (cu.DeviceGet(&dev, i) == CUDA_SUCCESS)
			cu.DeviceGetName(name, sizeof name, dev);
		size_t used = strlen(names);
		snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", name);
	}
	free(host);
	printf("cudacheck: ok: %d device%s (%s), 1 MiB set and copied back on each\n", n, n == 1 ? "" : "s", names);
	return EXIT_OK;
}
