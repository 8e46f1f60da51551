/* A recording stand-in for libcuda.so.1 (tests/tc_ops/test_tf_op_cuda.py): each driver call the
   TcCudaKernel launcher makes is printed; functions are named as cuda.h maps them
   (cuCtxPushCurrent -> cuCtxPushCurrent_v2), as the real driver exports them.  FAKE_CUDA_FAIL=<call>
   makes that call fail; -DOMIT_LAUNCH leaves cuLaunchKernel out (an "old driver"). */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fake_fn { char name[256]; int nparams; };
static struct fake_fn fns[64];
static int nfns;

static int failing(const char* call) {
  const char* f = getenv("FAKE_CUDA_FAIL");
  return f != NULL && strcmp(f, call) == 0;
}

CUresult cuGetErrorName(CUresult e, const char** s) {
  *s = e == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES ? "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"
     : e == CUDA_ERROR_UNSUPPORTED_PTX_VERSION ? "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"
     : e == CUDA_ERROR_NOT_FOUND ? "CUDA_ERROR_NOT_FOUND" : "CUDA_ERROR_UNKNOWN";
  return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult e, const char** s) { (void)e; *s = "fake driver"; return CUDA_SUCCESS; }
CUresult cuStreamGetCtx(CUstream s, CUcontext* c) {
  printf("ctx_of %p\n", (void*)s); *c = (CUcontext)0xC0; return CUDA_SUCCESS;
}
CUresult cuCtxPushCurrent(CUcontext c) { printf("push %p\n", (void*)c); return CUDA_SUCCESS; }
CUresult cuCtxPopCurrent(CUcontext* c) { printf("pop\n"); *c = (CUcontext)0xC0; return CUDA_SUCCESS; }
CUresult cuModuleLoadDataEx(CUmodule* m, const void* image, unsigned int n, CUjit_option* opts,
                            void** vals) {
  const char* p = (const char*)image;
  printf("load_module\n");
  if (failing("cuModuleLoadDataEx")) {
    for (unsigned int i = 0; i < n; ++i)
      if (opts[i] == CU_JIT_ERROR_LOG_BUFFER) strcpy((char*)vals[i], "ptxas fatal: fake JIT log");
    return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
  }
  nfns = 0;
  while ((p = strstr(p, ".entry ")) != NULL) {
    const char* open = strchr(p, '(');
    const char* close = strchr(open, ')');
    struct fake_fn* f = &fns[nfns++];
    p += 7;
    memcpy(f->name, p, (size_t)(open - p));
    f->name[open - p] = 0;
    f->nparams = 0;
    for (const char* q = open; (q = strstr(q, ".param")) != NULL && q < close; q += 6) f->nparams++;
    p = close;
  }
  *m = (CUmodule)0x10;
  return CUDA_SUCCESS;
}
CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
  (void)m;
  for (int i = 0; i < nfns; ++i)
    if (strcmp(fns[i].name, name) == 0) { *f = (CUfunction)&fns[i]; return CUDA_SUCCESS; }
  return CUDA_ERROR_NOT_FOUND;
}
CUresult cuModuleUnload(CUmodule m) { (void)m; printf("unload_module\n"); return CUDA_SUCCESS; }
CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream s) {
  printf("memset %llu value=%d bytes=%zu stream=%p\n", (unsigned long long)p, v, n, (void*)s);
  return CUDA_SUCCESS;
}
#ifndef OMIT_LAUNCH
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem,
                        CUstream s, void** params, void** extra) {
  struct fake_fn* fn = (struct fake_fn*)f;
  if (failing("cuLaunchKernel")) return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  printf("launch %s grid=%u,%u,%u block=%u,%u,%u smem=%u stream=%p extra=%p args=", fn->name,
         gx, gy, gz, bx, by, bz, smem, (void*)s, (void*)extra);
  for (int i = 0; i < fn->nparams; ++i)
    printf("%s%llu", i ? "," : "", (unsigned long long)*(CUdeviceptr*)params[i]);
  printf("\n");
  return CUDA_SUCCESS;
}
#endif
