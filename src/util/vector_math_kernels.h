// Chooses MKL's vector-math (VML) kernels once, single-threaded, before any parallel work.
//
// Why: LibTorch's CPU kernels for contiguous float and double exp, log, sqrt, sin, ... call MKL's
// VML on each intra-op thread's chunk (ATen/cpu/vml.h), asking for its high-accuracy kernels. VML
// chooses each function's kernel on that function's first call; when the first call runs on
// several threads at once, one thread may run a low-accuracy kernel for its whole chunk of that
// call, off by ~10^3 ulp (pytorch/pytorch#188792: oneMKL 2024.2, the one bundled with the torch
// 2.10 and 2.11 wheels). Seen here on an Intel Xeon, after a matmul: the process's first VML call
// at two threads had its second thread's chunk off by up to ~10^3 ulp in 1 to 4 processes of 100;
// every later call, of any function, was exact. So a run's first step, a resumed run's included,
// could differ from another run's, and tests comparing two runs failed now and then
// (docs/attention.md, "On an Intel Xeon").
#pragma once

#include <torch/torch.h>

#include <vector>

namespace darkformer {

// A LibTorch function that reaches VML in float and double (ATen/cpu/vml.h's IMPLEMENT_VML_MKL
// list), with inputs it takes in (0, 1).
struct VectorMathFunction {
  const char* name;
  torch::Tensor (*apply)(const torch::Tensor&);
};
const std::vector<VectorMathFunction>& VectorMathFunctions();

// Called first thing in main: one single-threaded call of each function, in float and in double.
void ChooseVectorMathKernels();

}  // namespace darkformer
