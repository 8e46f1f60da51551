// How TcCudaKernel talks to the CUDA driver, kept free of TensorFlow so that it can be tested
// against a recording fake libcuda on machines without a GPU (tests/tc_ops/test_tf_op_cuda.py):
// the driver's entry points resolved with dlopen/dlsym, the launch attributes' checks, and a
// launcher that loads a module once per context and runs its kernels on a stream.
#ifndef TFX_VEC_TC_OPS_TF_OP_TC_CUDA_LAUNCH_H_
#define TFX_VEC_TC_OPS_TF_OP_TC_CUDA_LAUNCH_H_

#include <cuda.h>
#include <dlfcn.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tfx_vec_tc {

#define TC_STR_(x) #x
#define TC_STR(x) TC_STR_(x)

// The driver entry points used here.  Each pointer has the type of cuda.h's prototype and is
// looked up under the name cuda.h maps it to (cuCtxPushCurrent is cuCtxPushCurrent_v2, ...).
struct CudaDriver {
#define TC_CU_FN(f) decltype(&::f) f = nullptr;
#define TC_CU_FUNCTIONS(X)                                                                     \
  X(cuGetErrorName) X(cuGetErrorString) X(cuStreamGetCtx) X(cuCtxPushCurrent)                  \
  X(cuCtxPopCurrent) X(cuModuleLoadDataEx) X(cuModuleGetFunction) X(cuModuleUnload)            \
  X(cuMemsetD8Async) X(cuLaunchKernel)
  TC_CU_FUNCTIONS(TC_CU_FN)
#undef TC_CU_FN
  std::string error;  // why the driver is unusable; empty when every entry point was found

  // The process' driver (libcuda.so.1), loaded on first use.
  static const CudaDriver& Get() {
    static const CudaDriver* driver = Load("libcuda.so.1");
    return *driver;
  }

  // A driver from the shared object `path` (never unloaded).
  static CudaDriver* Load(const char* path) {
    auto* d = new CudaDriver;
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      d->error = absl::StrCat("no CUDA driver: dlopen(", path,
                              ") failed: ", why ? why : "unknown error");
      return d;
    }
#define TC_CU_LOOKUP(f)                                                             \
  d->f = reinterpret_cast<decltype(&::f)>(dlsym(lib, TC_STR(f)));                   \
  if (!d->f && d->error.empty())                                                    \
    d->error = absl::StrCat("the CUDA driver lacks ", TC_STR(f), " (too old?)");
    TC_CU_FUNCTIONS(TC_CU_LOOKUP)
#undef TC_CU_LOOKUP
    return d;
  }
};

// "TcCudaKernel tc_<entry>: <parts>" as a status of `kind` (absl::InvalidArgumentError, ...).
template <typename... Parts>
absl::Status OpError(absl::Status (*kind)(absl::string_view), const std::string& entry,
                     const Parts&... parts) {
  return kind(absl::StrCat("TcCudaKernel tc_", entry, ": ", parts...));
}

inline absl::Status CuStatus(const CudaDriver& cu, CUresult r, const std::string& entry,
                             const std::string& what) {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  const char *name = nullptr, *text = nullptr;
  cu.cuGetErrorName(r, &name);
  cu.cuGetErrorString(r, &text);
  return OpError(absl::InternalError, entry, what, " failed: ", name ? name : "CUDA error", " (",
                 static_cast<int>(r), "): ", text ? text : "");
}

// The launch attributes are well formed: (x, y, z) grid and block sizes per kernel, each at
// least 1, at most 1024 threads per block, no negative temporary size.
inline absl::Status CheckLaunch(const std::string& entry, const std::vector<std::string>& kernels,
                                const std::vector<int64_t>& grid,
                                const std::vector<int64_t>& block,
                                const std::vector<int64_t>& temp_bytes) {
  const size_t dims = 3 * kernels.size();
  if (kernels.empty() || grid.size() != dims || block.size() != dims)
    return OpError(absl::InvalidArgumentError, entry, kernels.size(), " kernel(s) need ", dims,
                   " grid and block sizes, got ", grid.size(), " and ", block.size());
  for (size_t k = 0; k < kernels.size(); ++k) {
    int64_t threads = 1;
    for (int d = 0; d < 3; ++d) {
      const int64_t g = grid[3 * k + d], b = block[3 * k + d];
      if (g < 1 || b < 1 || g > INT32_MAX)
        return OpError(absl::InvalidArgumentError, entry, "kernel ", kernels[k],
                       " has a bad grid or block size");
      threads *= b;
    }
    if (threads > 1024)
      return OpError(absl::InvalidArgumentError, entry, "kernel ", kernels[k], " has ", threads,
                     " threads per block (CUDA allows 1024)");
  }
  for (int64_t b : temp_bytes)
    if (b < 0) return OpError(absl::InvalidArgumentError, entry, "negative temp_bytes");
  return absl::OkStatus();
}

// Makes a context current for a scope (the one TF's stream belongs to) and restores the previous.
class ScopedContext {
 public:
  ScopedContext(const CudaDriver& cu, CUcontext c) : cu_(cu) {
    ok_ = cu_.cuCtxPushCurrent(c) == CUDA_SUCCESS;
  }
  ~ScopedContext() {
    CUcontext popped;
    if (ok_) cu_.cuCtxPopCurrent(&popped);
  }
  bool ok() const { return ok_; }

 private:
  const CudaDriver& cu_;
  bool ok_;
};

// The kernels of a module in a context (the current one), loaded on first use and shared by
// every op that carries the same module text.  Modules stay loaded for the life of the process,
// as the cpu kernel's shared objects do.
inline absl::Status LoadFunctions(const CudaDriver& cu, CUcontext context,
                                  const std::string& entry, const std::string& module,
                                  const std::vector<std::string>& kernels,
                                  const std::vector<CUfunction>** out) {
  static std::mutex mu;
  static auto* loaded =
      new std::map<std::pair<CUcontext, std::string>, std::vector<CUfunction>>;
  std::lock_guard<std::mutex> lock(mu);
  std::string key = module;
  for (const std::string& k : kernels) key += std::string(1, '\0') + k;
  auto it = loaded->find({context, key});
  if (it != loaded->end()) {
    *out = &it->second;
    return absl::OkStatus();
  }
  // The JIT's error log says which PTX line a driver rejects (e.g. a PTX ISA newer than it).
  char log[8192] = {0};
  CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* vals[] = {log, reinterpret_cast<void*>(static_cast<uintptr_t>(sizeof log - 1))};
  CUmodule mod = nullptr;
  CUresult r = cu.cuModuleLoadDataEx(&mod, module.c_str(), 2, opts, vals);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(
        absl::StrCat(CuStatus(cu, r, entry, "cuModuleLoadData").message(), "\n", log));
  }
  std::vector<CUfunction> functions;
  for (const std::string& name : kernels) {
    CUfunction f = nullptr;
    r = cu.cuModuleGetFunction(&f, mod, name.c_str());
    if (r != CUDA_SUCCESS) {
      cu.cuModuleUnload(mod);
      return CuStatus(cu, r, entry, "cuModuleGetFunction(" + name + ")");
    }
    functions.push_back(f);
  }
  *out = &loaded->emplace(std::make_pair(context, key), std::move(functions)).first->second;
  return absl::OkStatus();
}

// Runs one op's kernels: on `stream`, in its context, the buffers in `zeroed` zero-filled first,
// then every kernel launched in order with one device pointer per entry of `args`.
class CudaLauncher {
 public:
  // The attributes must have passed CheckLaunch.
  CudaLauncher(std::string entry, std::string module, std::vector<std::string> kernels,
               std::vector<int64_t> grid, std::vector<int64_t> block)
      : entry_(std::move(entry)), module_(std::move(module)), kernels_(std::move(kernels)),
        grid_(std::move(grid)), block_(std::move(block)) {}

  absl::Status Run(const CudaDriver& cu, CUstream stream, std::vector<CUdeviceptr> args,
                   const std::vector<std::pair<CUdeviceptr, size_t>>& zeroed) {
    CUcontext context = nullptr;
    absl::Status s = CuStatus(cu, cu.cuStreamGetCtx(stream, &context), entry_, "cuStreamGetCtx");
    if (!s.ok()) return s;
    ScopedContext scope(cu, context);
    if (!scope.ok())
      return OpError(absl::InternalError, entry_, "cannot make the stream's context current");
    const std::vector<CUfunction>* functions = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (context != last_context_ || last_ == nullptr) {
        s = LoadFunctions(cu, context, entry_, module_, kernels_, &last_);
        if (!s.ok()) return s;
        last_context_ = context;
      }
      functions = last_;
    }
    for (const auto& z : zeroed) {
      if (z.second == 0) continue;
      s = CuStatus(cu, cu.cuMemsetD8Async(z.first, 0, z.second, stream), entry_,
                   "zero-filling a buffer");
      if (!s.ok()) return s;
    }
    std::vector<void*> params;
    for (CUdeviceptr& p : args) params.push_back(&p);
    for (size_t k = 0; k < functions->size(); ++k) {
      const int64_t* g = &grid_[3 * k];
      const int64_t* b = &block_[3 * k];
      CUresult r = cu.cuLaunchKernel((*functions)[k], g[0], g[1], g[2], b[0], b[1], b[2],
                                     /*sharedMemBytes=*/0, stream, params.data(), nullptr);
      s = CuStatus(cu, r, entry_, "launching " + kernels_[k]);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  std::string entry_, module_;
  std::vector<std::string> kernels_;
  std::vector<int64_t> grid_, block_;
  // The functions of the context this op last ran in (one per device in practice).
  std::mutex mu_;
  CUcontext last_context_ = nullptr;
  const std::vector<CUfunction>* last_ = nullptr;
};

}  // namespace tfx_vec_tc

#endif  // TFX_VEC_TC_OPS_TF_OP_TC_CUDA_LAUNCH_H_
