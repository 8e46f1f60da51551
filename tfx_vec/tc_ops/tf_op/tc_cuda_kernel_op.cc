// "TcCudaKernel": the GPU twin of TcKernel.  It launches a Tensor Comprehension's generated CUDA
// kernels on TensorFlow's own compute stream, on the tensors' device memory.
//
// The module travels in the op's attributes as PTX text (what `nvcc --ptx` made of the generated
// CUDA; a cubin or fatbin image works too), with the names of its kernels and, per kernel, the
// grid and block sizes of the GPU mapping.  Each kernel takes one pointer per buffer: the inputs,
// then the outputs, then the TC's temporaries (the ABI of codegen/cuda.py), and is launched in
// order on the stream.  Outputs and temporaries are zero-filled first, as the pycuda runtime and
// the cpu backend do (elements a TC leaves undefined read as 0).
//
// The CUDA driver API is resolved at run time from libcuda.so.1 (dlopen), never linked: the
// library builds and loads on a machine with no driver, where TensorFlow has no GPU device and
// this kernel is never instantiated.  Compiled with -DGOOGLE_CUDA=1 and CUDA's include directory
// (cuda.h gives the driver API's types and prototypes); see tf_op.py, load_cuda_op_library().
#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "xla/stream_executor/stream.h"
#include "tc_op_common.h"

using namespace tensorflow;  // NOLINT

REGISTER_OP("TcCudaKernel")
    .Input("inputs: Tin")
    .Output("outputs: Tout")
    .Attr("Tin: list(type) >= 0")
    .Attr("Tout: list(type) >= 1")
    .Attr("input_shapes: list(shape)")
    .Attr("output_shapes: list(shape)")
    // The TC's name (for messages).
    .Attr("entry: string")
    // PTX (or a cubin/fatbin image) for cuModuleLoadData.
    .Attr("module: string")
    // Launched in this order; grid and block hold (x, y, z) per kernel.
    .Attr("kernels: list(string) >= 1")
    .Attr("grid: list(int)")
    .Attr("block: list(int)")
    // Bytes of each TC temporary (passed after the outputs).
    .Attr("temp_bytes: list(int) = []")
    // Names the Python-side gradient (a backward TC) of this op; unused by the kernel.
    .Attr("grad_key: string = ''")
    .SetShapeFn(tfx_vec_tc::OutputShapesFromAttr);

namespace {

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

  static const CudaDriver& Get() {
    static const CudaDriver* driver = Load();
    return *driver;
  }

 private:
  static CudaDriver* Load() {
    auto* d = new CudaDriver;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      d->error = std::string("no CUDA driver: dlopen(libcuda.so.1) failed: ") +
                 (why ? why : "unknown error");
      return d;
    }
#define TC_CU_LOOKUP(f)                                                             \
  d->f = reinterpret_cast<decltype(&::f)>(dlsym(lib, TC_STR(f)));                   \
  if (!d->f && d->error.empty())                                                    \
    d->error = std::string("the CUDA driver lacks ") + TC_STR(f) + " (too old?)";
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

absl::Status CuStatus(const CudaDriver& cu, CUresult r, const std::string& entry,
                      const std::string& what) {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  const char *name = nullptr, *text = nullptr;
  cu.cuGetErrorName(r, &name);
  cu.cuGetErrorString(r, &text);
  return OpError(absl::InternalError, entry, what, " failed: ", name ? name : "CUDA error", " (",
                 static_cast<int>(r), "): ", text ? text : "");
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
absl::Status LoadFunctions(const CudaDriver& cu, CUcontext context, const std::string& entry,
                     const std::string& module, const std::vector<std::string>& kernels,
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
  void* vals[] = {log, reinterpret_cast<void*>(static_cast<uintptr_t>(sizeof log))};
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

class TcCudaKernelOp : public OpKernel {
 public:
  explicit TcCudaKernelOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("input_shapes", &in_shapes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_shapes", &shapes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("entry", &entry_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("module", &module_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("kernels", &kernels_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("grid", &grid_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("block", &block_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("temp_bytes", &temp_bytes_));
    const size_t dims = 3 * kernels_.size();
    OP_REQUIRES(ctx, grid_.size() == dims && block_.size() == dims,
                OpError(absl::InvalidArgumentError, entry_, kernels_.size(), " kernel(s) need ",
                        dims, " grid and block sizes, got ", grid_.size(), " and ",
                        block_.size()));
    for (size_t k = 0; k < kernels_.size(); ++k) {
      int64_t threads = 1;
      for (int d = 0; d < 3; ++d) {
        const int64_t g = grid_[3 * k + d], b = block_[3 * k + d];
        OP_REQUIRES(ctx, g >= 1 && b >= 1 && g <= INT32_MAX,
                    OpError(absl::InvalidArgumentError, entry_, "kernel ", kernels_[k],
                            " has a bad grid or block size"));
        threads *= b;
      }
      OP_REQUIRES(ctx, threads <= 1024,
                  OpError(absl::InvalidArgumentError, entry_, "kernel ", kernels_[k], " has ",
                          threads, " threads per block (CUDA allows 1024)"));
    }
    for (int64_t b : temp_bytes_)
      OP_REQUIRES(ctx, b >= 0, OpError(absl::InvalidArgumentError, entry_, "negative temp_bytes"));
    const CudaDriver& cu = CudaDriver::Get();
    OP_REQUIRES(ctx, cu.error.empty(), OpError(absl::FailedPreconditionError, entry_, cu.error));
  }

  void Compute(OpKernelContext* ctx) override {
    const CudaDriver& cu = CudaDriver::Get();
    DeviceContext* dc = ctx->op_device_context();
    OP_REQUIRES(ctx, dc != nullptr && dc->stream() != nullptr,
                OpError(absl::InternalError, entry_, "no GPU stream (not on a GPU?)"));
    CUstream stream = static_cast<CUstream>(dc->stream()->platform_specific_handle().stream);
    OP_REQUIRES(ctx, stream != nullptr,
                OpError(absl::InternalError, entry_, "the stream is not a CUDA stream"));
    CUcontext context = nullptr;
    OP_REQUIRES_OK(ctx, CuStatus(cu, cu.cuStreamGetCtx(stream, &context), entry_,
                                 "cuStreamGetCtx"));
    ScopedContext scope(cu, context);
    OP_REQUIRES(ctx, scope.ok(),
                OpError(absl::InternalError, entry_, "cannot make TF's CUDA context current"));
    const std::vector<CUfunction>* functions = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (context != last_context_) {
        OP_REQUIRES_OK(ctx, LoadFunctions(cu, context, entry_, module_, kernels_, &last_));
        last_context_ = context;
      }
      functions = last_;
    }

    std::vector<CUdeviceptr> ptrs;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      const Tensor& t = ctx->input(i);
      OP_REQUIRES_OK(ctx, tfx_vec_tc::CheckInputShape(entry_, i, t, in_shapes_));
      ptrs.push_back(reinterpret_cast<CUdeviceptr>(t.tensor_data().data()));
    }
    std::vector<Tensor> temps(temp_bytes_.size());
    std::vector<std::pair<CUdeviceptr, size_t>> zeroed;
    for (int i = 0; i < ctx->num_outputs(); ++i) {
      TensorShape shape;
      OP_REQUIRES_OK(ctx, tfx_vec_tc::OutputShape(entry_, i, shapes_[i], &shape));
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, shape, &out));
      ptrs.push_back(reinterpret_cast<CUdeviceptr>(out->tensor_data().data()));
      zeroed.emplace_back(ptrs.back(), out->TotalBytes());
    }
    // Scratch memory from TF's allocator: freeing it when Compute returns is safe because later
    // users of the memory are ordered after this op's kernels on the same stream.
    for (size_t i = 0; i < temp_bytes_.size(); ++i) {
      const int64_t bytes = std::max<int64_t>(temp_bytes_[i], 1);
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_UINT8, TensorShape({bytes}), &temps[i]));
      ptrs.push_back(reinterpret_cast<CUdeviceptr>(temps[i].tensor_data().data()));
      zeroed.emplace_back(ptrs.back(), static_cast<size_t>(temp_bytes_[i]));
    }
    for (const auto& z : zeroed) {
      if (z.second == 0) continue;
      OP_REQUIRES_OK(ctx, CuStatus(cu, cu.cuMemsetD8Async(z.first, 0, z.second, stream),
                                   entry_, "zero-filling a buffer"));
    }
    std::vector<void*> params;
    for (CUdeviceptr& p : ptrs) params.push_back(&p);
    for (size_t k = 0; k < functions->size(); ++k) {
      const int64_t* g = &grid_[3 * k];
      const int64_t* b = &block_[3 * k];
      CUresult r = cu.cuLaunchKernel((*functions)[k], g[0], g[1], g[2], b[0], b[1], b[2],
                                     /*sharedMemBytes=*/0, stream, params.data(), nullptr);
      OP_REQUIRES_OK(ctx, CuStatus(cu, r, entry_, "launching " + kernels_[k]));
    }
  }

 private:
  std::vector<PartialTensorShape> in_shapes_, shapes_;
  std::string entry_, module_;
  std::vector<std::string> kernels_;
  std::vector<int64_t> grid_, block_, temp_bytes_;
  // The functions of the context this kernel last ran in (one per device in practice).
  std::mutex mu_;
  CUcontext last_context_ = nullptr;
  const std::vector<CUfunction>* last_ = nullptr;
};

REGISTER_KERNEL_BUILDER(Name("TcCudaKernel").Device(DEVICE_GPU), TcCudaKernelOp);

}  // namespace
