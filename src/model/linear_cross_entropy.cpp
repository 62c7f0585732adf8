// Chunked cross-entropy through the LM head (see linear_cross_entropy.h). Per chunk, with
// z = h W^T, t = tanh(z / cap), logits l = cap t (or l = z without a cap) and p = softmax(l):
//   loss = sum_rows (logsumexp(l) - l[label])
//   dl = p - onehot(label)    dz = dl (1 - t^2)    dh = dz W    dW = dz^T h
// for labelled rows (ignored rows contribute nothing).
#include "model/linear_cross_entropy.h"

#include "util/error.h"
#include "util/labels.h"

namespace darkformer {

namespace {

struct ChunkOut {
  torch::Tensor loss_sum;  // fp32 scalar
  torch::Tensor dz_CV;     // dL/dz in z's dtype (undefined unless asked)
  torch::Tensor correct;   // int64 scalar (undefined unless asked)
};

// One chunk's loss and, optionally, dL/dz and the count of correct argmax predictions. The C x V
// buffers are reused in place: z (autocast dtype), its fp32 copy, and t under a soft-cap.
ChunkOut Chunk(const torch::Tensor& h_CE, const torch::Tensor& w_VE, const torch::Tensor& labels_C, double softcap,
               bool want_grad, bool want_correct) {
  const auto z_CV = torch::matmul(h_CE, w_VE.t());  // under autocast: the autocast dtype, as the full head
  auto l_CV = z_CV.to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
  torch::Tensor t_CV;
  if (softcap > 0) {
    t_CV = l_CV.div_(softcap).tanh_();
    l_CV = t_CV * softcap;
  }
  const auto valid_C = labels_C.ne(kIgnoreIndex);
  const auto safe_labels_C1 = labels_C.masked_fill(valid_C.logical_not(), 0).unsqueeze(1);
  const auto lse_C = torch::logsumexp(l_CV, -1);
  const auto picked_C = l_CV.gather(1, safe_labels_C1).squeeze(1);
  ChunkOut out;
  out.loss_sum = (lse_C - picked_C).masked_fill(valid_C.logical_not(), 0.0).sum();
  if (want_correct) out.correct = (l_CV.argmax(-1).eq(labels_C) & valid_C).sum();
  if (!want_grad) return out;
  // p - onehot, zero on ignored rows, in place in l's buffer.
  auto dl_CV = l_CV.sub_(lse_C.unsqueeze(1)).exp_();
  dl_CV.scatter_add_(1, safe_labels_C1, -torch::ones_like(safe_labels_C1, dl_CV.options()));
  dl_CV.mul_(valid_C.unsqueeze(1).to(dl_CV.scalar_type()));
  if (softcap > 0) dl_CV.mul_(t_CV.mul_(t_CV).neg_().add_(1.0));  // dz = dl (1 - t^2)
  out.dz_CV = dl_CV.to(z_CV.scalar_type());
  return out;
}

class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden_NE,
                               const torch::Tensor& weight_VE, const torch::Tensor& labels_N,
                               const LinearCrossEntropyOptions& options, bool want_dh, bool want_dw) {
    const int64_t rows = hidden_NE.size(0);
    auto loss = torch::zeros({}, hidden_NE.options().dtype(torch::kFloat32));
    torch::Tensor dh_NE = want_dh ? torch::empty_like(hidden_NE) : torch::Tensor();
    torch::Tensor dw_VE = want_dw ? torch::zeros_like(weight_VE, weight_VE.options().dtype(torch::kFloat32))
                                  : torch::Tensor();
    for (int64_t start = 0; start < rows; start += options.chunk_rows) {
      const int64_t c = std::min(options.chunk_rows, rows - start);
      const auto h_CE = hidden_NE.narrow(0, start, c);
      const auto out = Chunk(h_CE, weight_VE, labels_N.narrow(0, start, c), options.softcap, want_dh || want_dw,
                             /*want_correct=*/false);
      loss.add_(out.loss_sum);
      // The products of the gradient in the dtype the forward's product ran in (autocast's),
      // accumulated in the parameters' dtype.
      if (want_dh) dh_NE.narrow(0, start, c).copy_(torch::matmul(out.dz_CV, weight_VE));
      if (want_dw) dw_VE.add_(torch::matmul(out.dz_CV.t(), h_CE));
    }
    ctx->save_for_backward({dh_NE, dw_VE.defined() ? dw_VE.to(weight_VE.scalar_type()) : dw_VE});
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    // The saved gradients are this node's own: scaled in place (a second V x E copy of dW is
    // 2 GB at Gemma's size), so the node can run its backward once only.
    DF_CHECK(ctx->saved_data.find("done") == ctx->saved_data.end(),
             "LinearCrossEntropy: backward ran twice through a retained graph (not supported)");
    ctx->saved_data["done"] = true;
    const auto saved = ctx->get_saved_variables();
    const auto& g = grad_outputs[0];
    auto scaled = [&](torch::Tensor d) { return d.defined() ? d.mul_(g.to(d.scalar_type())) : d; };
    return {scaled(saved[0]), scaled(saved[1]), {}, {}, {}, {}};
  }
};

void CheckShapes(const torch::Tensor& hidden_NE, const torch::Tensor& weight_VE, const torch::Tensor& labels_N,
                 const LinearCrossEntropyOptions& options) {
  DF_CHECK(hidden_NE.dim() == 2 && weight_VE.dim() == 2 && labels_N.dim() == 1 &&
               hidden_NE.size(1) == weight_VE.size(1) && labels_N.size(0) == hidden_NE.size(0),
           "LinearCrossEntropy: expected hidden N x E, weight V x E, labels N; got "
               << hidden_NE.sizes() << ", " << weight_VE.sizes() << ", " << labels_N.sizes());
  DF_CHECK(options.chunk_rows > 0, "LinearCrossEntropy: chunk_rows must be positive, got " << options.chunk_rows);
}

}  // namespace

torch::Tensor LinearCrossEntropySum(const torch::Tensor& hidden_NE, const torch::Tensor& weight_VE,
                                    const torch::Tensor& labels_N, const LinearCrossEntropyOptions& options) {
  CheckShapes(hidden_NE, weight_VE, labels_N, options);
  const bool grad = torch::GradMode::is_enabled();
  return LinearCrossEntropyFunction::apply(hidden_NE, weight_VE, labels_N, options,
                                           grad && hidden_NE.requires_grad(), grad && weight_VE.requires_grad());
}

torch::Tensor LinearCrossEntropyEval(const torch::Tensor& hidden_NE, const torch::Tensor& weight_VE,
                                     const torch::Tensor& labels_N, const LinearCrossEntropyOptions& options) {
  CheckShapes(hidden_NE, weight_VE, labels_N, options);
  torch::NoGradGuard no_grad;
  auto sums = torch::zeros({3}, hidden_NE.options().dtype(torch::kFloat64));
  const int64_t rows = hidden_NE.size(0);
  for (int64_t start = 0; start < rows; start += options.chunk_rows) {
    const int64_t c = std::min(options.chunk_rows, rows - start);
    const auto labels_C = labels_N.narrow(0, start, c);
    const auto out = Chunk(hidden_NE.narrow(0, start, c), weight_VE, labels_C, options.softcap, false, true);
    // fp64 holds the counts exactly (below 2^53) and the fp32 loss sums as they are.
    const auto f64 = [](const torch::Tensor& t) { return t.to(torch::kFloat64); };
    sums.add_(torch::stack({f64(out.loss_sum), f64(out.correct), f64(labels_C.ne(kIgnoreIndex).sum())}));
  }
  return sums;
}

}  // namespace darkformer
