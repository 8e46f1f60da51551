// "TcCudaKernel": the GPU twin of TcKernel.  It launches a Tensor Comprehension's generated CUDA
// kernels on TensorFlow's own compute stream, on the tensors' device memory.
//
// Like TcKernel it carries the TC, never code (PTX is code too; see tc_op_common.h): for each
// tuple of concrete input shapes the builder (tfx_vec's TC compiler, in this process) maps the
// TC to the GPU, prints CUDA, turns it into PTX with the locally configured nvcc, and answers
// with the module, the names of its kernels and, per kernel, the grid and block sizes of the
// mapping, plus the sizes of the TC's temporaries.  Each kernel takes one pointer per buffer:
// the inputs, then the outputs, then the temporaries (the ABI of codegen/cuda.py), and is
// launched in order on the stream.  Outputs and temporaries are zero-filled first, as the cpu
// op does (elements a TC leaves undefined read as 0).
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
    // The virtual GPU architecture the PTX is generated for (the driver JIT-compiles it).
    .Attr("cuda_arch: string = 'compute_75'");

namespace {

using tfx_vec_tc::OpError;

// One signature's kernels: the launcher (module and launches) and the buffers' sizes.
struct CudaKernel {
  std::unique_ptr<tfx_vec_tc::CudaLauncher> launcher;
  std::vector<TensorShape> outputs;
  std::vector<int64_t> temp_bytes;
};

class TcCudaKernelOp : public OpKernel {
 public:
  explicit TcCudaKernelOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
    const tfx_vec_tc::CudaDriver& cu = tfx_vec_tc::CudaDriver::Get();
    OP_REQUIRES(ctx, cu.error.empty(),
                OpError(absl::FailedPreconditionError, attrs_.entry, cu.error));
    std::vector<TensorShape> shapes;
    if (attrs_.StaticInputShapes(&shapes)) {
      const CudaKernel* k = nullptr;
      OP_REQUIRES_OK(ctx, kernels_.Get(shapes, Make(), &k));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    DeviceContext* dc = ctx->op_device_context();
    OP_REQUIRES(ctx, dc != nullptr && dc->stream() != nullptr,
                OpError(absl::InternalError, attrs_.entry, "no GPU stream (not on a GPU?)"));
    CUstream stream = static_cast<CUstream>(dc->stream()->platform_specific_handle().stream);
    OP_REQUIRES(ctx, stream != nullptr,
                OpError(absl::InternalError, attrs_.entry, "the stream is not a CUDA stream"));
    std::vector<TensorShape> shapes;
    OP_REQUIRES_OK(ctx, attrs_.InputShapes(ctx, &shapes));
    const CudaKernel* k = nullptr;
    OP_REQUIRES_OK(ctx, kernels_.Get(shapes, Make(), &k));

    std::vector<CUdeviceptr> args;
    for (int i = 0; i < ctx->num_inputs(); ++i)
      args.push_back(reinterpret_cast<CUdeviceptr>(ctx->input(i).tensor_data().data()));
    std::vector<std::pair<CUdeviceptr, size_t>> zeroed;
    for (int i = 0; i < ctx->num_outputs(); ++i) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, k->outputs[i], &out));
      args.push_back(reinterpret_cast<CUdeviceptr>(out->tensor_data().data()));
      zeroed.emplace_back(args.back(), out->TotalBytes());
    }
    // Scratch memory from TF's allocator: freeing it when Compute returns is safe because later
    // users of the memory are ordered after this op's kernels on the same stream.
    std::vector<Tensor> temps(k->temp_bytes.size());
    for (size_t i = 0; i < k->temp_bytes.size(); ++i) {
      const int64_t bytes = std::max<int64_t>(k->temp_bytes[i], 1);
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_UINT8, TensorShape({bytes}), &temps[i]));
      args.push_back(reinterpret_cast<CUdeviceptr>(temps[i].tensor_data().data()));
      zeroed.emplace_back(args.back(), static_cast<size_t>(k->temp_bytes[i]));
    }
    OP_REQUIRES_OK(ctx, k->launcher->Run(tfx_vec_tc::CudaDriver::Get(), stream,
                                         std::move(args), zeroed));
  }

 private:
  tfx_vec_tc::KernelsByShape<CudaKernel>::Make Make() const {
    return [this](const std::vector<TensorShape>& shapes, CudaKernel* k) -> absl::Status {
      NodeDef reply;
      TF_RETURN_IF_ERROR(tfx_vec_tc::Build(*this, shapes, &reply));
      TF_RETURN_IF_ERROR(tfx_vec_tc::ReplyOutputShapes(attrs_, reply, &k->outputs));
      // Scalars in device memory cannot be checked each run: the builder never specialises a
      // GPU kernel's subscripts to a scalar's value.
      tfx_vec_tc::ScalarChecks scalars;
      TF_RETURN_IF_ERROR(scalars.Read(attrs_, reply, static_cast<int>(shapes.size())));
      if (!scalars.inputs.empty())
        return OpError(absl::InternalError, attrs_.entry, "unexpected scalar checks");
      std::string module;
      std::vector<std::string> kernels;
      std::vector<int64_t> grid, block;
      TF_RETURN_IF_ERROR(GetNodeAttr(reply, "module", &module));
      TF_RETURN_IF_ERROR(GetNodeAttr(reply, "kernels", &kernels));
      TF_RETURN_IF_ERROR(GetNodeAttr(reply, "grid", &grid));
      TF_RETURN_IF_ERROR(GetNodeAttr(reply, "block", &block));
      TF_RETURN_IF_ERROR(GetNodeAttr(reply, "temp_bytes", &k->temp_bytes));
      TF_RETURN_IF_ERROR(
          tfx_vec_tc::CheckLaunch(attrs_.entry, kernels, grid, block, k->temp_bytes));
      k->launcher = std::make_unique<tfx_vec_tc::CudaLauncher>(
          attrs_.entry, std::move(module), std::move(kernels), std::move(grid),
          std::move(block));
      return absl::OkStatus();
    };
  }

  tfx_vec_tc::OpAttrs attrs_;
  tfx_vec_tc::KernelsByShape<CudaKernel> kernels_;
};

REGISTER_KERNEL_BUILDER(Name("TcCudaKernel").Device(DEVICE_GPU), TcCudaKernelOp);

}  // namespace
