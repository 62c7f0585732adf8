// See vector_math_kernels.h.
#include "util/vector_math_kernels.h"

namespace darkformer {

const std::vector<VectorMathFunction>& VectorMathFunctions() {
  static const std::vector<VectorMathFunction> functions = {
      {"acos", [](const torch::Tensor& x) { return torch::acos(x); }},
      {"asin", [](const torch::Tensor& x) { return torch::asin(x); }},
      {"atan", [](const torch::Tensor& x) { return torch::atan(x); }},
      {"cos", [](const torch::Tensor& x) { return torch::cos(x); }},
      {"erf", [](const torch::Tensor& x) { return torch::erf(x); }},
      {"erfc", [](const torch::Tensor& x) { return torch::erfc(x); }},
      {"erfinv", [](const torch::Tensor& x) { return torch::erfinv(x); }},
      {"exp", [](const torch::Tensor& x) { return torch::exp(x); }},
      {"log", [](const torch::Tensor& x) { return torch::log(x); }},
      {"log10", [](const torch::Tensor& x) { return torch::log10(x); }},
      {"log2", [](const torch::Tensor& x) { return torch::log2(x); }},
      {"sin", [](const torch::Tensor& x) { return torch::sin(x); }},
      {"sqrt", [](const torch::Tensor& x) { return torch::sqrt(x); }},
      {"tan", [](const torch::Tensor& x) { return torch::tan(x); }},
      {"tanh", [](const torch::Tensor& x) { return torch::tanh(x); }},
      {"trunc", [](const torch::Tensor& x) { return torch::trunc(x); }},
  };
  return functions;
}

void ChooseVectorMathKernels() {
  // 16 elements: far below ATen's grain size (2,048 for these ops), so one thread makes each call.
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    const auto x = torch::full({16}, 0.5, torch::TensorOptions().dtype(dtype));
    for (const auto& function : VectorMathFunctions()) function.apply(x);
  }
}

}  // namespace darkformer
