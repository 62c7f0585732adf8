// Keeps the memory a process frees for its next allocations instead of handing it back to the
// operating system (glibc only; elsewhere a no-op).
//
// Why: a CPU training step allocates and frees the same large tensors every step (activations,
// gradients, attention outputs: 32 MiB each at L = 16k, H = 8, D = 64). glibc serves blocks above
// its mmap threshold (32 MiB at most) with fresh pages that the kernel faults in and zeroes on
// every call; at L = 16k that was 13 % of a random-feature attention call (docs/attention.md).
// Served from the heap and never trimmed, the second step reuses the first step's pages, as
// jemalloc or tcmalloc (which PyTorch recommends for CPU training) would. The resident set then
// stays at its high-water mark until the process ends.
#pragma once

namespace darkformer {

// Called first thing in main. Does nothing where the user chose glibc's malloc settings through
// the environment (GLIBC_TUNABLES with a malloc tunable, or a MALLOC_*_ variable). Returns whether
// it changed them.
bool RetainFreedHeapMemory();

}  // namespace darkformer
