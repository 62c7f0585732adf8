// LibTorch's intra-op threads set to one for a scope (as train.deterministic runs), then as they
// were: for tests that compare two calls bit for bit. At two threads, the composite form's outputs
// (performer, lfk) have differed in the last bits between two calls, identical inputs included,
// about once in 40-60 runs of such a test on an Intel Xeon.
#pragma once

#include <torch/torch.h>

namespace darkformer::testing {

class OneIntraOpThread {
 public:
  OneIntraOpThread() : saved_(torch::get_num_threads()) { torch::set_num_threads(1); }
  ~OneIntraOpThread() { torch::set_num_threads(saved_); }
  OneIntraOpThread(const OneIntraOpThread&) = delete;
  OneIntraOpThread& operator=(const OneIntraOpThread&) = delete;

 private:
  int saved_;
};

}  // namespace darkformer::testing
