// What the TcKernel (cpu) and TcCudaKernel (gpu) ops share: their signature, the shape
// function, the input-shape check, and how an op gets its kernel from the builder.
//
// A graph carries a Tensor Comprehension, never code: the op's attributes are the TC's source
// text (`tc`), the def to run (`entry`), its mapping options (JSON), the values of the int
// scalars that size or index tensors (JSON) and, for a gradient, the inputs it is taken with
// respect to (`derivative`).  The kernel for concrete input shapes comes from
// the *builder*: tfx_vec's own TC compiler in this process, registered from Python by
// tfx_vec.tc_ops.tf_op.load_op_library() through tfx_vec_tc_set_builder().  It checks the
// request (the TC parses and type-checks, dtypes and shapes match its signature, sizes are
// bounded), generates the code, compiles it with the locally configured compiler into the
// signed private cache and answers with a function (cpu) or a PTX module and its launches
// (gpu).  Include this header in exactly one translation unit per op library.
#ifndef TFX_VEC_TC_OPS_TF_OP_TC_OP_COMMON_H_
#define TFX_VEC_TC_OPS_TF_OP_TC_OP_COMMON_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"

// The signature every TC op has; each op appends its own attributes:
//   REGISTER_OP("TcKernel") TFX_VEC_TC_OP_SIGNATURE;
#define TFX_VEC_TC_OP_SIGNATURE                                                            \
  .Input("inputs: Tin")                                                                    \
      .Output("outputs: Tout")                                                             \
      .Attr("Tin: list(type) >= 0")                                                        \
      .Attr("Tout: list(type) >= 1")                                                       \
      /* The computation: TC source text and the def to run (compiled locally). */         \
      .Attr("tc: string")                                                                  \
      .Attr("entry: string")                                                               \
      /* MappingOptions as JSON; int scalars that size or index tensors as JSON. */        \
      .Attr("options: string")                                                             \
      .Attr("scalars: string = '{}'")                                                      \
      /* Non-empty: run the backward TC of the TC w.r.t. these inputs (JSON list), derived */ \
      /* when the kernel is made, at the forward's shapes (its inputs come first). */         \
      .Attr("derivative: string = ''")                                                     \
      /* Shapes as known when the graph was built (-1: any size, a kernel per size). */    \
      .Attr("input_shapes: list(shape)")                                                   \
      .Attr("output_shapes: list(shape)")                                                  \
      /* Names the Python-side gradient (a backward TC) of this op; unused by the kernel. */ \
      .Attr("grad_key: string = ''")                                                       \
      .SetShapeFn(tfx_vec_tc::OutputShapesFromAttr)

namespace tfx_vec_tc {

using ::tensorflow::NodeDef;
using ::tensorflow::OpKernel;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::TensorShape;

// "<op> tc_<entry>: <parts>" as a status of `kind` (absl::InvalidArgumentError, ...).
template <typename... Parts>
absl::Status TcOpError(absl::Status (*kind)(absl::string_view), const std::string& op,
                     const std::string& entry, const Parts&... parts) {
  return kind(absl::StrCat(op, " tc_", entry, ": ", parts...));
}

// Output i has shape output_shapes[i] (dimensions of -1 are known only when the op runs).
inline absl::Status OutputShapesFromAttr(::tensorflow::shape_inference::InferenceContext* c) {
  std::vector<PartialTensorShape> shapes;
  TF_RETURN_IF_ERROR(c->GetAttr("output_shapes", &shapes));
  if (static_cast<int>(shapes.size()) != c->num_outputs())
    return absl::InvalidArgumentError(absl::StrCat(
        "TcKernel: ", shapes.size(), " output_shapes for ", c->num_outputs(), " outputs"));
  for (int i = 0; i < c->num_outputs(); ++i) {
    ::tensorflow::shape_inference::ShapeHandle h;
    TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &h));
    c->set_output(i, h);
  }
  return absl::OkStatus();
}

// The attributes every TC op kernel reads, checked for consistency with its inputs and outputs.
struct OpAttrs {
  std::string op, entry;
  std::vector<PartialTensorShape> in_shapes, out_shapes;

  absl::Status Read(::tensorflow::OpKernelConstruction* ctx) {
    op = ctx->def().op();
    TF_RETURN_IF_ERROR(ctx->GetAttr("entry", &entry));
    TF_RETURN_IF_ERROR(ctx->GetAttr("input_shapes", &in_shapes));
    TF_RETURN_IF_ERROR(ctx->GetAttr("output_shapes", &out_shapes));
    if (static_cast<int>(in_shapes.size()) != ctx->num_inputs() ||
        static_cast<int>(out_shapes.size()) != ctx->num_outputs())
      return TcOpError(absl::InvalidArgumentError, op, entry, in_shapes.size(),
                     " input_shapes and ", out_shapes.size(), " output_shapes for ",
                     ctx->num_inputs(), " inputs and ", ctx->num_outputs(), " outputs");
    return absl::OkStatus();
  }

  // The input shapes of one run, each compatible with the graph's input_shapes[i].
  absl::Status InputShapes(::tensorflow::OpKernelContext* ctx,
                           std::vector<TensorShape>* shapes) const {
    shapes->clear();
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      const TensorShape& s = ctx->input(i).shape();
      if (!in_shapes[i].IsCompatibleWith(s))
        return TcOpError(absl::InvalidArgumentError, op, entry, "input ", i, " has shape ",
                       s.DebugString(), " but the graph declares ", in_shapes[i].DebugString());
      shapes->push_back(s);
    }
    return absl::OkStatus();
  }

  // The input shapes when the graph fixes every dimension (a kernel is built at construction).
  bool StaticInputShapes(std::vector<TensorShape>* shapes) const {
    shapes->clear();
    for (const PartialTensorShape& p : in_shapes) {
      TensorShape s;
      if (!p.AsTensorShape(&s)) return false;
      shapes->push_back(s);
    }
    return true;
  }
};

// -- the builder ---------------------------------------------------------------------------
extern "C" {
// Copies the builder's reply (a serialized NodeDef) into `reply`.
typedef void (*TfxVecTcReplyWriter)(void* reply, const char* data, size_t size);
// request: a serialized NodeDef (the op's own, plus "_concrete_input_shapes"); the builder
// answers through write(reply, ...) and returns 0 (an error travels in the reply's "error").
typedef int (*TfxVecTcBuilder)(const char* request, size_t size, void* reply,
                               TfxVecTcReplyWriter write);
}

inline std::atomic<TfxVecTcBuilder>& BuilderSlot() {
  static std::atomic<TfxVecTcBuilder> slot{nullptr};
  return slot;
}

extern "C" {
// Called once by tfx_vec.tc_ops.tf_op when it loads this library.
__attribute__((visibility("default"))) void tfx_vec_tc_set_builder(TfxVecTcBuilder builder) {
  BuilderSlot().store(builder);
}
static void WriteReply(void* reply, const char* data, size_t size) {
  static_cast<std::string*>(reply)->assign(data, size);
}
}

// The builder's answer for `op` at these input shapes: the reply's attributes (for TcKernel
// "function" and "output_shapes"; for TcCudaKernel the module and its launches too).  An error
// the builder reports (a bad TC, mismatched dtypes or sizes, a compiler failure) comes back with
// its status code and message.
inline absl::Status Build(const OpKernel& op, const std::vector<TensorShape>& shapes,
                          NodeDef* reply) {
  std::string entry;
  ::tensorflow::TryGetNodeAttr(op.def(), "entry", &entry);
  TfxVecTcBuilder builder = BuilderSlot().load();
  if (builder == nullptr)
    return TcOpError(absl::FailedPreconditionError, op.def().op(), entry,
                   "no TC kernel builder is registered in this process: load the op library "
                   "with tfx_vec.tc_ops.tf_op.load_op_library() (or load_cuda_op_library()) "
                   "before running or loading a graph that holds it, not tf.load_op_library");
  NodeDef request = op.def();
  ::tensorflow::AttrValue concrete;
  for (const TensorShape& s : shapes) s.AsProto(concrete.mutable_list()->add_shape());
  (*request.mutable_attr())["_concrete_input_shapes"] = concrete;
  std::string bytes, answer;
  if (!request.SerializeToString(&bytes))
    return TcOpError(absl::InternalError, op.def().op(), entry, "cannot serialize the request");
  const int rc = builder(bytes.data(), bytes.size(), &answer, &WriteReply);
  if (!reply->ParseFromString(answer))
    return TcOpError(absl::InternalError, op.def().op(), entry,
                     "the builder's reply is unreadable");
  std::string error;
  if (::tensorflow::TryGetNodeAttr(*reply, "error", &error) && !error.empty()) {
    int64_t code = static_cast<int64_t>(absl::StatusCode::kInternal);
    ::tensorflow::TryGetNodeAttr(*reply, "error_code", &code);
    if (code <= 0 || code > static_cast<int64_t>(absl::StatusCode::kUnauthenticated))
      code = static_cast<int64_t>(absl::StatusCode::kInternal);
    return absl::Status(static_cast<absl::StatusCode>(code), error);
  }
  if (rc != 0)
    return TcOpError(absl::InternalError, op.def().op(), entry, "the builder failed (", rc, ")");
  return absl::OkStatus();
}

// The reply's concrete output shapes, each compatible with what the graph declares.
inline absl::Status ReplyOutputShapes(const OpAttrs& attrs, const NodeDef& reply,
                                      std::vector<TensorShape>* out) {
  std::vector<PartialTensorShape> shapes;
  TF_RETURN_IF_ERROR(::tensorflow::GetNodeAttr(reply, "output_shapes", &shapes));
  if (shapes.size() != attrs.out_shapes.size())
    return TcOpError(absl::InternalError, attrs.op, attrs.entry, "the builder made ",
                   shapes.size(), " outputs for ", attrs.out_shapes.size());
  out->clear();
  for (size_t i = 0; i < shapes.size(); ++i) {
    TensorShape s;
    if (!shapes[i].AsTensorShape(&s) || !attrs.out_shapes[i].IsCompatibleWith(s))
      return TcOpError(absl::InvalidArgumentError, attrs.op, attrs.entry, "output ", i,
                     " has shape ", shapes[i].DebugString(), " for these inputs, but the graph "
                     "declares ", attrs.out_shapes[i].DebugString());
    out->push_back(s);
  }
  return absl::OkStatus();
}

// The int scalar inputs a kernel was specialised to (the reply's "scalar_inputs" and
// "scalar_values"): checked every run, so another value is an error, never a kernel running on
// a value its bounds were not proven for.
struct ScalarChecks {
  std::vector<int64_t> inputs, values;

  absl::Status Read(const OpAttrs& attrs, const NodeDef& reply, int num_inputs) {
    TF_RETURN_IF_ERROR(::tensorflow::GetNodeAttr(reply, "scalar_inputs", &inputs));
    TF_RETURN_IF_ERROR(::tensorflow::GetNodeAttr(reply, "scalar_values", &values));
    bool ok = inputs.size() == values.size();
    for (int64_t i : inputs) ok = ok && i >= 0 && i < num_inputs;
    if (!ok)
      return TcOpError(absl::InternalError, attrs.op, attrs.entry, "bad scalar checks");
    return absl::OkStatus();
  }

  // For inputs in host memory (the cpu op).
  absl::Status Check(const OpAttrs& attrs, ::tensorflow::OpKernelContext* ctx) const {
    for (size_t k = 0; k < inputs.size(); ++k) {
      const ::tensorflow::Tensor& t = ctx->input(static_cast<int>(inputs[k]));
      int64_t v = 0;
      if (t.NumElements() != 1 || !ScalarValue(t, &v) || v != values[k])
        return TcOpError(absl::InvalidArgumentError, attrs.op, attrs.entry, "input ",
                         inputs[k], " is a scalar the kernel was specialised to the value ",
                         values[k], " of (it sizes or indexes tensors); got ",
                         t.DebugString());
    }
    return absl::OkStatus();
  }

  static bool ScalarValue(const ::tensorflow::Tensor& t, int64_t* v) {
    switch (t.dtype()) {
#define TC_SCALAR_CASE(DT, T) \
  case ::tensorflow::DT:      \
    *v = static_cast<int64_t>(t.flat<T>()(0)); \
    return true;
      TC_SCALAR_CASE(DT_INT8, int8_t)
      TC_SCALAR_CASE(DT_INT16, int16_t)
      TC_SCALAR_CASE(DT_INT32, int32_t)
      TC_SCALAR_CASE(DT_INT64, int64_t)
      TC_SCALAR_CASE(DT_UINT8, uint8_t)
      TC_SCALAR_CASE(DT_UINT16, uint16_t)
      TC_SCALAR_CASE(DT_UINT32, uint32_t)
#undef TC_SCALAR_CASE
      default:
        return false;
    }
  }
};

// The kernels of one op, one per distinct tuple of input shapes, made on first use.
template <typename Kernel>
class KernelsByShape {
 public:
  using Make = std::function<absl::Status(const std::vector<TensorShape>&, Kernel*)>;

  absl::Status Get(const std::vector<TensorShape>& shapes, const Make& make,
                   const Kernel** out) {
    std::vector<int64_t> key;
    for (const TensorShape& s : shapes) {
      key.push_back(s.dims());
      for (int64_t d : s.dim_sizes()) key.push_back(d);
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kernels_.find(key);
    if (it == kernels_.end()) {
      auto k = std::make_unique<Kernel>();
      TF_RETURN_IF_ERROR(make(shapes, k.get()));
      it = kernels_.emplace(std::move(key), std::move(k)).first;
    }
    *out = it->second.get();
    return absl::OkStatus();
  }

 private:
  std::mutex mu_;
  std::map<std::vector<int64_t>, std::unique_ptr<Kernel>> kernels_;
};

}  // namespace tfx_vec_tc

#endif  // TFX_VEC_TC_OPS_TF_OP_TC_OP_COMMON_H_
