// The memory estimate's shadow of a forward (train/memory_estimate.h): ops replayed on sizes only,
// recording what autograd's nodes would save for the backward (each storage once), by the rules
// autograd uses (a product saves an operand only when the other needs a gradient, a frozen Linear
// keeps no copy of its input, ...), under fp32 or bf16 autocast. Each layer and kernel replays its
// own forward on a Tape beside that forward (ShadowForward).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>

namespace darkformer::shadow {

constexpr int64_t kF32 = 4, kBf16 = 2;

// A tensor of the shadow forward: its size, element size and whether it needs a gradient.
// Parameters have id -1: saving them costs nothing (the weights are counted once, elsewhere).
struct Shadow {
  int64_t numel = 0;
  int64_t esz = kF32;
  bool rg = false;
  int64_t id = -1;
  int64_t bytes() const { return numel * esz; }
};

// Replays ops on sizes: records which tensors autograd's nodes save (each storage once) and
// the largest transient (allocated and dropped within the layer).
class Tape {
 public:
  // fused_norms: RMSNorm runs as LibTorch's fused op (on CUDA: model/rms_norm.cpp).
  explicit Tape(bool bf16, bool fused_norms = false) : bf16_(bf16), fused_norms_(fused_norms) {}

  Shadow New(int64_t numel, int64_t esz, bool rg) { return {numel, esz, rg, next_id_++}; }
  static Shadow Param(int64_t numel, bool trainable) { return {numel, kF32, trainable, -1}; }
  void Save(const Shadow& t) {
    if (t.id >= 0) saved_[t.id] = t.bytes();
  }
  int64_t SavedBytes() const {
    int64_t total = 0;
    for (const auto& [id, bytes] : saved_) total += bytes;
    return total;
  }
  bool IsSaved(const Shadow& t) const { return saved_.count(t.id) > 0; }
  bool bf16() const { return bf16_; }
  int64_t act() const { return bf16_ ? kBf16 : kF32; }  // a Linear output's element size

  Shadow To(const Shadow& t, int64_t esz) { return t.esz == esz ? t : New(t.numel, esz, t.rg); }
  Shadow Copy(const Shadow& t) { return New(t.numel, t.esz, t.rg); }
  // a * b (same sizes, or b small): a is saved when b needs a gradient, b when a does.
  Shadow Mul(const Shadow& a, const Shadow& b) {
    if (b.rg) Save(a);
    if (a.rg) Save(b);
    return New(std::max(a.numel, b.numel), std::max(a.esz, b.esz), a.rg || b.rg);
  }
  Shadow Add(const Shadow& a, const Shadow& b) {
    return New(std::max(a.numel, b.numel), std::max(a.esz, b.esz), a.rg || b.rg);
  }
  // torch::nn::Linear without bias: out = x W^T. Under autocast, x and W are cast to bf16 for
  // this use (not cached: C++ Linear multiplies by a transposed view).
  Shadow Linear(const Shadow& x, const Shadow& w, int64_t in, int64_t out) {
    const int64_t rows = x.numel / in;
    if (!x.rg && !w.rg) return New(rows * out, act(), false);
    Shadow xin = x, win = w;
    if (bf16_) {
      xin = To(x, kBf16);
      // A weight stored in bf16 (train.frozen_weights_bf16) is used as it is: no cast.
      if (w.esz != kBf16) win = New(w.numel, kBf16, w.rg);
    }
    if (w.rg) Save(xin);
    if (x.rg) Save(win);
    return New(rows * out, act(), true);
  }
  // Gemma's RMSNorm in fp32: x * rsqrt(mean(x^2) + eps) * (1 + w), back to x's dtype. Fused, one
  // node saves its fp32 input and each row's rsqrt whichever of x and w needs the gradient;
  // composed, the products save what they need.
  Shadow RmsNorm(const Shadow& x, const Shadow& w, int64_t dim) {
    const Shadow xf = To(x, kF32);
    if (!xf.rg && !w.rg) return To(New(x.numel, kF32, false), x.esz);
    if (fused_norms_) {
      Save(xf);
      Save(New(x.numel / dim, kF32, false));
      return To(New(x.numel, kF32, true), x.esz);
    }
    if (xf.rg) {
      Save(xf);                                  // pow, and x * rsqrt
      Save(New(x.numel / dim, kF32, true));      // rsqrt's result
    }
    const Shadow normed = New(x.numel, kF32, xf.rg);
    if (w.rg) Save(normed);                      // * (1 + w) with w trainable
    return To(New(x.numel, kF32, true), x.esz);
  }
  // RoPE in fp32: products with the constant tables save nothing.
  Shadow Rope(const Shadow& x) { return To(New(x.numel, kF32, x.rg), x.esz); }
  Shadow Gelu(const Shadow& x) {
    if (x.rg) Save(x);
    return New(x.numel, x.esz, x.rg);
  }

 private:
  bool bf16_, fused_norms_;
  int64_t next_id_ = 0;
  std::map<int64_t, int64_t> saved_;
};

}  // namespace darkformer::shadow
