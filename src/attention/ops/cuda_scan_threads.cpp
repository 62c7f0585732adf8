// A block's threads as fibers of the host thread (cuda_scan_threads.h): each runs until it reaches
// a barrier or ends, then the next in the order; once all have, the next phase. ucontext's stacks.
#include "attention/ops/cuda_scan_threads.h"

#include <ucontext.h>

#include <atomic>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace darkformer::cuda_scan {

namespace {

std::atomic<bool> device_threads{false}, reversed{false};

// A fiber's stack: the scan's steps inline deep (their staging batches and panels' lambdas).
constexpr size_t kStackBytes = 512 * 1024;

struct Fiber {
  ucontext_t context;
  bool done = false;
};

}  // namespace

struct HostThreads {
  int size = 0;
  const std::function<void(const Block&)>* body = nullptr;
  std::vector<Fiber> fibers;
  std::vector<char> flags;  // HostBarrierOr's, one per thread
  ucontext_t scheduler;
  int current = 0;
  std::exception_ptr error;
};

namespace {

thread_local HostThreads* running = nullptr;
// The stacks, kept for the host thread's next block.
thread_local std::vector<std::unique_ptr<char[]>> stacks;

void FiberMain() {
  HostThreads* t = running;
  const int tid = t->current;
  try {
    (*t->body)(Block{tid, t->size, nullptr, t});
  } catch (...) {
    if (!t->error) t->error = std::current_exception();
  }
  t->fibers[tid].done = true;  // then back to the scheduler (uc_link)
}

void Check(int status, const char* what) {
  if (status != 0) throw std::runtime_error(std::string("op: cuda host threads: ") + what + " failed");
}

// A fiber that starts at FiberMain on `stack` and returns to `link`. Its own function: getcontext
// returns twice, and the caller's loop variables would be the compiler's to clobber.
[[gnu::noinline]] void MakeFiber(ucontext_t& c, char* stack, ucontext_t* link) {
  Check(getcontext(&c), "getcontext");
  c.uc_stack.ss_sp = stack;
  c.uc_stack.ss_size = kStackBytes;
  c.uc_link = link;
  makecontext(&c, FiberMain, 0);
}

}  // namespace

void HostBarrier(HostThreads* t) {
  Check(swapcontext(&t->fibers[t->current].context, &t->scheduler), "swapcontext");
}

bool HostBarrierOr(HostThreads* t, int tid, bool flag) {
  t->flags[tid] = flag ? 1 : 0;
  HostBarrier(t);
  bool any = false;
  for (const char f : t->flags) any = any || f != 0;
  HostBarrier(t);  // every thread has read the flags before any writes its next
  return any;
}

void SetHostThreadOrderForTesting(HostThreadOrder order) {
  device_threads = order.device_threads;
  reversed = order.reversed;
}

HostThreadOrder HostThreadOrderNow() { return {device_threads.load(), reversed.load()}; }

void RunHostBlock(int threads, const std::function<void(const Block&)>& body) {
  if (!device_threads || threads <= 1) {
    body(Block{});
    return;
  }
  if (running != nullptr) throw std::logic_error("op: cuda host threads: a block inside a block");
  HostThreads t;
  t.size = threads;
  t.body = &body;
  t.fibers.resize(threads);
  t.flags.assign(threads, 0);
  while (stacks.size() < static_cast<size_t>(threads)) stacks.emplace_back(new char[kStackBytes]);
  for (int i = 0; i < threads; ++i) MakeFiber(t.fibers[i].context, stacks[i].get(), &t.scheduler);
  running = &t;
  const bool backwards = reversed;
  try {
    for (int64_t phase = 0;; ++phase) {
      for (int k = 0; k < threads; ++k) {
        const int i = backwards ? threads - 1 - k : k;
        if (t.fibers[i].done) continue;
        t.current = i;
        Check(swapcontext(&t.scheduler, &t.fibers[i].context), "swapcontext");
        if (t.error) std::rethrow_exception(t.error);
      }
      int done = 0;
      for (const Fiber& f : t.fibers) done += f.done ? 1 : 0;
      if (done == threads) break;
      if (done > 0) {
        throw std::logic_error("op: cuda host threads: " + std::to_string(threads - done) + " of " +
                               std::to_string(threads) + " threads wait at a barrier (phase " + std::to_string(phase) +
                               ") that the other " + std::to_string(done) + " never reach");
      }
    }
  } catch (...) {
    running = nullptr;  // the waiting fibers are abandoned; their stacks are reused
    throw;
  }
  running = nullptr;
}

}  // namespace darkformer::cuda_scan
