// What the TcKernel (cpu) and TcCudaKernel (gpu) ops share: the shape function (output shapes
// come from an attribute, kernels are specialised to sizes) and the input-shape check.
#ifndef TFX_VEC_TC_OPS_TF_OP_TC_OP_COMMON_H_
#define TFX_VEC_TC_OPS_TF_OP_TC_OP_COMMON_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

// The signature every TC op has (inputs, outputs, their shapes, the TC's name for messages,
// the Python-side gradient's key, the shape function); each op appends its own attributes:
//   REGISTER_OP("TcKernel") TFX_VEC_TC_OP_SIGNATURE .Attr("source: string") ...;
#define TFX_VEC_TC_OP_SIGNATURE                                                            \
  .Input("inputs: Tin")                                                                    \
      .Output("outputs: Tout")                                                             \
      .Attr("Tin: list(type) >= 0")                                                        \
      .Attr("Tout: list(type) >= 1")                                                       \
      .Attr("input_shapes: list(shape)")                                                   \
      .Attr("output_shapes: list(shape)")                                                  \
      .Attr("entry: string")                                                               \
      /* Names the Python-side gradient (a backward TC) of this op; unused by the kernel. */ \
      .Attr("grad_key: string = ''")                                                       \
      .SetShapeFn(tfx_vec_tc::OutputShapesFromAttr)

namespace tfx_vec_tc {

// Output i has shape output_shapes[i].
inline absl::Status OutputShapesFromAttr(
    ::tensorflow::shape_inference::InferenceContext* c) {
  std::vector<::tensorflow::PartialTensorShape> shapes;
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

// Kernels are specialised to sizes: an input of another shape would be read out of bounds.
inline absl::Status CheckInputShape(
    const std::string& entry, int i, const ::tensorflow::Tensor& t,
    const std::vector<::tensorflow::PartialTensorShape>& expected) {
  if (i < static_cast<int>(expected.size()) &&
      expected[i].IsIdenticalTo(::tensorflow::PartialTensorShape(t.shape().dim_sizes())))
    return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "TcKernel tc_", entry, ": input ", i, " has shape ", t.shape().DebugString(),
      " but the kernel was compiled for ",
      i < static_cast<int>(expected.size()) ? expected[i].DebugString() : std::string("none")));
}

// The output's shape as a TensorShape (the attribute may only hold fully known shapes).
inline absl::Status OutputShape(const std::string& entry, int i,
                                        const ::tensorflow::PartialTensorShape& shape,
                                        ::tensorflow::TensorShape* out) {
  if (shape.AsTensorShape(out)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("TcKernel tc_", entry, ": output ", i, " has an unknown shape"));
}

}  // namespace tfx_vec_tc

#endif  // TFX_VEC_TC_OPS_TF_OP_TC_OP_COMMON_H_
