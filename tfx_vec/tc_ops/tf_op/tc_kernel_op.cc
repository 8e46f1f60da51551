// "TcKernel": one generic TensorFlow op that runs a Tensor Comprehension on the CPU.
//
// The op carries the TC, never code (see tc_op_common.h): for each tuple of concrete input
// shapes it asks the builder (tfx_vec's TC compiler, in this process) for the kernel
//     extern "C" void tc_<entry>(void* const* args)
// generated and compiled here, and calls it on the tensors' buffers: inputs in order, then the
// outputs, which are zero-filled first (elements a TC leaves undefined read as 0, never as
// uninitialised memory).  When the graph fixes every input shape the kernel is made when the op
// is constructed; otherwise on the first run at each new shape (as the original TC compiled on
// first call), and kept for the op's lifetime.
#include <cstring>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tc_op_common.h"

using namespace tensorflow;  // NOLINT

REGISTER_OP("TcKernel") TFX_VEC_TC_OP_SIGNATURE;

namespace {

typedef void (*TcFn)(void* const*);

struct CpuKernel {
  TcFn fn = nullptr;
  std::vector<TensorShape> outputs;
  tfx_vec_tc::ScalarChecks scalars;
};

class TcKernelOp : public OpKernel {
 public:
  explicit TcKernelOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
    std::vector<TensorShape> shapes;
    if (attrs_.StaticInputShapes(&shapes)) {  // build now: errors show when the graph loads
      const CpuKernel* k = nullptr;
      OP_REQUIRES_OK(ctx, kernels_.Get(shapes, Make(), &k));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    std::vector<TensorShape> shapes;
    OP_REQUIRES_OK(ctx, attrs_.InputShapes(ctx, &shapes));
    const CpuKernel* k = nullptr;
    OP_REQUIRES_OK(ctx, kernels_.Get(shapes, Make(), &k));
    OP_REQUIRES_OK(ctx, k->scalars.Check(attrs_, ctx));
    std::vector<void*> args;
    for (int i = 0; i < ctx->num_inputs(); ++i)
      args.push_back(const_cast<char*>(ctx->input(i).tensor_data().data()));
    for (int i = 0; i < ctx->num_outputs(); ++i) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, k->outputs[i], &out));
      char* data = const_cast<char*>(out->tensor_data().data());
      std::memset(data, 0, out->tensor_data().size());
      args.push_back(data);
    }
    k->fn(args.data());
  }

 private:
  tfx_vec_tc::KernelsByShape<CpuKernel>::Make Make() const {
    return [this](const std::vector<TensorShape>& shapes, CpuKernel* k) -> absl::Status {
      NodeDef reply;
      TF_RETURN_IF_ERROR(tfx_vec_tc::Build(*this, shapes, &reply));
      TF_RETURN_IF_ERROR(tfx_vec_tc::ReplyOutputShapes(attrs_, reply, &k->outputs));
      TF_RETURN_IF_ERROR(k->scalars.Read(attrs_, reply, static_cast<int>(shapes.size())));
      int64_t fn = 0;
      TF_RETURN_IF_ERROR(GetNodeAttr(reply, "function", &fn));
      if (fn == 0)
        return tfx_vec_tc::TcOpError(absl::InternalError, attrs_.op, attrs_.entry,
                                     "the builder returned no function");
      k->fn = reinterpret_cast<TcFn>(static_cast<uintptr_t>(fn));
      return absl::OkStatus();
    };
  }

  tfx_vec_tc::OpAttrs attrs_;
  tfx_vec_tc::KernelsByShape<CpuKernel> kernels_;
};

REGISTER_KERNEL_BUILDER(Name("TcKernel").Device(DEVICE_CPU), TcKernelOp);

}  // namespace
