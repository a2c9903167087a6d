/*
 * fakecuda: a stand-in libcuda.so.1 for cudacheck's own tests on hosts
 * without a GPU. It has one device whose memory is the host's: every call
 * cudacheck makes works on host memory, and a launch of --spin's kernel
 * ("spin", buf, n) stores in buf[i] what the kernel would, thread i's
 * value after n steps x = x * 1664525 + 1013904223 (computed by jumping
 * ahead, not step by step), after checking the grid and the parameters
 * cudacheck passes. FAKECUDA_WRONG=1 makes it store a wrong value for the
 * last thread; FAKECUDA_NO_DEVICE=1 makes cuInit find no device.
 *
 * Build: gcc -O2 -shared -fPIC -o libcuda.so.1 fakecuda.c
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;
typedef int CUjit_option;

enum {
	OK = 0,
	INVALID_VALUE = 1,
	NO_DEVICE = 100,
	INVALID_IMAGE = 200,
	NOT_FOUND = 500,
	OUT_OF_MEMORY = 2,
};

static int ctx_token, mod_token, fn_token;

CUresult cuInit(unsigned int flags)
{
	const char *e = getenv("FAKECUDA_NO_DEVICE");
	if (flags != 0)
		return INVALID_VALUE;
	return e != NULL && strcmp(e, "1") == 0 ? NO_DEVICE : OK;
}

CUresult cuDeviceGetCount(int *n)
{
	*n = 1;
	return OK;
}

CUresult cuDeviceGet(CUdevice *d, int i)
{
	if (i != 0)
		return INVALID_VALUE;
	*d = 0;
	return OK;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
	(void)d;
	strncpy(name, "fakecuda", (size_t)len);
	name[len - 1] = '\0';
	return OK;
}

CUresult cuCtxCreate_v2(CUcontext *c, unsigned int flags, CUdevice d)
{
	if (flags != 0 || d != 0)
		return INVALID_VALUE;
	*c = &ctx_token;
	return OK;
}

CUresult cuCtxDestroy_v2(CUcontext c)
{
	return c == &ctx_token ? OK : INVALID_VALUE;
}

CUresult cuCtxSynchronize(void)
{
	return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size)
{
	void *m = malloc(size);
	if (m == NULL)
		return OUT_OF_MEMORY;
	*p = (CUdeviceptr)(uintptr_t)m;
	return OK;
}

CUresult cuMemFree_v2(CUdeviceptr p)
{
	free((void *)(uintptr_t)p);
	return OK;
}

CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n)
{
	memset((void *)(uintptr_t)p, v, n);
	return OK;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
	memcpy(dst, (void *)(uintptr_t)src, n);
	return OK;
}

CUresult cuGetErrorName(CUresult r, const char **s)
{
	*s = r == OK ? "CUDA_SUCCESS" : "FAKECUDA_ERROR";
	return OK;
}

CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned int n, CUjit_option *opts, void **vals)
{
	/* The error log buffer and its size, as cudacheck passes them. */
	if (n != 2 || opts[0] != 5 || opts[1] != 6 || vals[0] == NULL || (uintptr_t)vals[1] == 0)
		return INVALID_VALUE;
	const char *ptx = image;
	if (strstr(ptx, ".version 7.0\n") != ptx || strstr(ptx, ".entry spin(") == NULL) {
		strncpy(vals[0], "fakecuda: not the spin kernel", (uintptr_t)vals[1]);
		return INVALID_IMAGE;
	}
	*m = &mod_token;
	return OK;
}

CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
	if (m != &mod_token)
		return INVALID_VALUE;
	if (strcmp(name, "spin") != 0)
		return NOT_FOUND;
	*f = &fn_token;
	return OK;
}

CUresult cuModuleUnload(CUmodule m)
{
	return m == &mod_token ? OK : INVALID_VALUE;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
			unsigned int by, unsigned int bz, unsigned int shared, CUstream s, void **params, void **extra)
{
	if (f != &fn_token || gy != 1 || gz != 1 || by != 1 || bz != 1 || shared != 0 || s != NULL ||
	    params == NULL || extra != NULL || gx == 0 || bx == 0 || bx > 1024)
		return INVALID_VALUE;
	uint32_t *buf = (uint32_t *)(uintptr_t)*(CUdeviceptr *)params[0];
	uint32_t n = *(unsigned int *)params[1];
	/* x -> a x + c, n times, is x -> A x + C. */
	uint32_t A = 1, C = 0, a = 1664525u, c = 1013904223u;
	for (uint32_t k = n; k > 0; k >>= 1) {
		if (k & 1) {
			A = a * A;
			C = a * C + c;
		}
		c = a * c + c;
		a = a * a;
	}
	uint32_t threads = gx * bx;
	for (uint32_t i = 0; i < threads; i++)
		buf[i] = A * i + C;
	const char *e = getenv("FAKECUDA_WRONG");
	if (e != NULL && strcmp(e, "1") == 0)
		buf[threads - 1] ^= 1;
	return OK;
}
