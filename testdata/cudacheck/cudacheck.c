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
 *
 * Build: gcc -O2 -o cudacheck cudacheck.c -ldl
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

#define CUDA_SUCCESS 0
#define CUDA_ERROR_NO_DEVICE 100

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
} cu;

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

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--dlopen") == 0)
		return dlopen_each(argc - 2, argv + 2);
	unsigned long mib = 0;
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
	} else if (argc > 1) {
		fprintf(stderr, "usage: cudacheck [--dlopen FILE... | --alloc MIB [WAIT]]\n");
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
