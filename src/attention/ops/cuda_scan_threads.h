// How the host emulation of op: cuda's scan (cuda_scan_host.cpp) runs a block: by one thread, as
// the CPU suite's arithmetic tests take it, or by the device's own count of threads, each a fiber
// of the host thread that switches at every barrier (Block::Sync), in order of tid or the reverse,
// and a launch's blocks in order or in reverse. Every thread then takes the share of each step the
// device's thread of that tid takes, and every barrier is the device's. A barrier missing between a
// step's writes and another thread's reads makes the reader see the old values in one of the two
// orders; a step split wrongly between threads skips or repeats elements; a block that reads what
// another block of the same launch writes sees it in one block order only; each changes the bits
// (cuda_op_threads_test.cpp). A barrier that not every thread reaches (one inside a branch on tid:
// on the device a hang or worse) is an error here. Host only; the device never sees these.
#pragma once

#include <cstdint>
#include <functional>

#include "attention/ops/cuda_scan_block.h"

namespace darkformer::cuda_scan {

struct HostThreadOrder {
  bool device_threads = false;  // the device's threads per block, not one
  bool reversed = false;        // threads and blocks from the last
};
// The order the host emulation takes from now on, in this process (the tests set it).
void SetHostThreadOrderForTesting(HostThreadOrder order);
HostThreadOrder HostThreadOrderNow();

// body(block) by one block of `threads` threads (one where the order says so), then back.
void RunHostBlock(int threads, const std::function<void(const Block&)>& body);

// block(i) for the launch's blocks i in [0, n), in the order's order.
template <typename F>
void ForEachHostBlock(int64_t n, F block) {
  const bool reversed = HostThreadOrderNow().reversed;
  for (int64_t k = 0; k < n; ++k) block(reversed ? n - 1 - k : k);
}

}  // namespace darkformer::cuda_scan
