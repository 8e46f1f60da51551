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
// What talks to the driver is in tc_cuda_launch.h; this file is the TensorFlow side: attributes,
// TF's stream, and the buffers from TF's allocator.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "xla/stream_executor/stream.h"
#include "tc_cuda_launch.h"
#include "tc_op_common.h"

using namespace tensorflow;  // NOLINT

REGISTER_OP("TcCudaKernel") TFX_VEC_TC_OP_SIGNATURE
    // PTX (or a cubin/fatbin image) for cuModuleLoadData.
    .Attr("module: string")
    // Launched in this order; grid and block hold (x, y, z) per kernel.
    .Attr("kernels: list(string) >= 1")
    .Attr("grid: list(int)")
    .Attr("block: list(int)")
    // Bytes of each TC temporary (passed after the outputs).
    .Attr("temp_bytes: list(int) = []");

namespace {

using tfx_vec_tc::OpError;

class TcCudaKernelOp : public OpKernel {
 public:
  explicit TcCudaKernelOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string module;
    std::vector<std::string> kernels;
    std::vector<int64_t> grid, block;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("input_shapes", &in_shapes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_shapes", &shapes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("entry", &entry_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("module", &module));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("kernels", &kernels));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("grid", &grid));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("block", &block));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("temp_bytes", &temp_bytes_));
    OP_REQUIRES_OK(ctx, tfx_vec_tc::CheckLaunch(entry_, kernels, grid, block, temp_bytes_));
    const tfx_vec_tc::CudaDriver& cu = tfx_vec_tc::CudaDriver::Get();
    OP_REQUIRES(ctx, cu.error.empty(), OpError(absl::FailedPreconditionError, entry_, cu.error));
    launcher_ = std::make_unique<tfx_vec_tc::CudaLauncher>(entry_, std::move(module),
                                                           std::move(kernels), std::move(grid),
                                                           std::move(block));
  }

  void Compute(OpKernelContext* ctx) override {
    DeviceContext* dc = ctx->op_device_context();
    OP_REQUIRES(ctx, dc != nullptr && dc->stream() != nullptr,
                OpError(absl::InternalError, entry_, "no GPU stream (not on a GPU?)"));
    CUstream stream = static_cast<CUstream>(dc->stream()->platform_specific_handle().stream);
    OP_REQUIRES(ctx, stream != nullptr,
                OpError(absl::InternalError, entry_, "the stream is not a CUDA stream"));

    std::vector<CUdeviceptr> args;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      const Tensor& t = ctx->input(i);
      OP_REQUIRES_OK(ctx, tfx_vec_tc::CheckInputShape(entry_, i, t, in_shapes_));
      args.push_back(reinterpret_cast<CUdeviceptr>(t.tensor_data().data()));
    }
    std::vector<std::pair<CUdeviceptr, size_t>> zeroed;
    for (int i = 0; i < ctx->num_outputs(); ++i) {
      TensorShape shape;
      OP_REQUIRES_OK(ctx, tfx_vec_tc::OutputShape(entry_, i, shapes_[i], &shape));
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, shape, &out));
      args.push_back(reinterpret_cast<CUdeviceptr>(out->tensor_data().data()));
      zeroed.emplace_back(args.back(), out->TotalBytes());
    }
    // Scratch memory from TF's allocator: freeing it when Compute returns is safe because later
    // users of the memory are ordered after this op's kernels on the same stream.
    std::vector<Tensor> temps(temp_bytes_.size());
    for (size_t i = 0; i < temp_bytes_.size(); ++i) {
      const int64_t bytes = std::max<int64_t>(temp_bytes_[i], 1);
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_UINT8, TensorShape({bytes}), &temps[i]));
      args.push_back(reinterpret_cast<CUdeviceptr>(temps[i].tensor_data().data()));
      zeroed.emplace_back(args.back(), static_cast<size_t>(temp_bytes_[i]));
    }
    OP_REQUIRES_OK(ctx, launcher_->Run(tfx_vec_tc::CudaDriver::Get(), stream, std::move(args),
                                       zeroed));
  }

 private:
  std::vector<PartialTensorShape> in_shapes_, shapes_;
  std::string entry_;
  std::vector<int64_t> temp_bytes_;
  std::unique_ptr<tfx_vec_tc::CudaLauncher> launcher_;
};

REGISTER_KERNEL_BUILDER(Name("TcCudaKernel").Device(DEVICE_GPU), TcCudaKernelOp);

}  // namespace
