// Packed windows with document masking (document_mask.h), for every registered kernel and every
// form of the causal operator: a window of several documents gives the outputs and gradients of
// running each document alone and joining the results (1e-5 relative, fp32); changing every token
// of one document leaves the others' outputs bit-identical; the chunk-parallel form's op count does
// not grow with the number of documents. Windows start and end mid-document, hold a one-token
// document, and put boundaries on chunk edges and inside chunks (chunk 8).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "attention/derf_test_state.h"
#include "attention/document_mask.h"
#include "attention/kernel_registry.h"
#include "attention/ops/fast_exp2.h"
#include "attention/ops/raw_cpu_kernel.h"
#include "cuda_op_emulated.h"
#include "util/op_count.h"

namespace darkformer {
namespace {

constexpr int64_t kBatch = 3, kHeads = 4, kKvHeads = 2, kLength = 40, kDim = 8, kFeatures = 16, kChunk = 8;

// The causal operator's forms; kernels without an `op` option have one form (""). cuda: the CUDA
// operator's scan, emulated on the host (cuda_op_emulated.h), each document a segment of its own.
const std::vector<std::string> kForms = {"naive", "auto", "chunk_loop", "chunk_parallel", "raw_cpu", "cuda"};

std::string Options(const std::string& name, const std::string& op) {
  std::string yaml = "{num_features: " + std::to_string(kFeatures) + ", chunk_size: " + std::to_string(kChunk);
  if (!op.empty()) yaml += ", op: " + op;
  if (name == "gerf") yaml += ", a: -0.2";
  return yaml + "}";
}

bool Builds(const std::string& name, const std::string& yaml) {
  try {
    MakeAttentionKernel(name, KernelShape{kHeads, kDim}, ConfigReader(YAML::Load(yaml), "attention." + name));
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// Whether the kernel with `op: raw_cpu` runs here (fp32 positive features on an AVX2 CPU).
bool RawCpuRuns(const std::string& name) {
  try {
    auto kernel = MakeAttentionKernel(name, KernelShape{kHeads, kDim},
                                      ConfigReader(YAML::Load(Options(name, "raw_cpu")), "attention." + name));
    const auto x = torch::randn({1, kHeads, 4, kDim}), y = torch::randn({1, kKvHeads, 4, kDim});
    kernel->forward(x, y, y, AttentionCall{});
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// The forms a kernel has: those of the operator (raw_cpu where it runs); exact's two ways with
// documents (a mask, or one call each); else one ("").
std::vector<std::string> FormsOf(const std::string& name) {
  if (Builds(name, "{documents: mask}")) return {"mask", "per_document"};
  if (!Builds(name, Options(name, "naive"))) return {""};
  std::vector<std::string> forms;
  for (const auto& form : kForms) {
    if (form != "raw_cpu" || RawCpuRuns(name)) forms.push_back(form);
  }
  return forms;
}

AttentionKernel Make(const std::string& name, const std::string& op) {
  torch::manual_seed(5);
  const bool features = Builds(name, Options(name, "naive")) || Builds(name, Options(name, ""));
  const std::string yaml = features ? Options(name, op) : op.empty() ? "{}" : "{documents: " + op + "}";
  auto kernel = MakeAttentionKernel(name, KernelShape{kHeads, kDim}, ConfigReader(YAML::Load(yaml), "attention." + name));
  torch::NoGradGuard no_grad;
  torch::manual_seed(6);
  for (auto& p : kernel->parameters()) p.add_(0.1 * torch::randn_like(p));
  PerturbDerf(*kernel, 0.3, 12);
  return kernel;
}

// Row 0: boundaries on chunk edges (8, 24), inside chunks (11, 30) and a one-token document at
// 11; row 1: short documents inside the first chunk (5, 6, 7) and one at 20; row 2: no boundary.
// Every row starts and ends mid-document (nothing marks it: a window is cut from a stream).
torch::Tensor DocumentIds() {
  const std::vector<std::vector<int64_t>> starts = {{8, 11, 12, 24, 30}, {5, 6, 7, 20}, {}};
  auto ids = torch::zeros({kBatch, kLength}, torch::kLong);
  for (int64_t b = 0; b < kBatch; ++b) {
    for (const int64_t s : starts[b]) ids[b].narrow(0, s, kLength - s).add_(1);
  }
  return ids;
}

struct Inputs {
  torch::Tensor q, k, v, weights;
};
Inputs MakeInputs(uint64_t seed = 7) {
  torch::manual_seed(seed);
  return {torch::randn({kBatch, kHeads, kLength, kDim}), torch::randn({kBatch, kKvHeads, kLength, kDim}),
          torch::randn({kBatch, kKvHeads, kLength, kDim}), torch::randn({kBatch, kHeads, kLength, kDim})};
}

struct Result {
  torch::Tensor out;
  std::vector<torch::Tensor> grads;  // q, k, v, then the kernel's parameters
};

AttentionCall Call(const torch::Tensor& document_ids) {
  AttentionCall call;
  call.scale = 1.0 / std::sqrt(static_cast<double>(kDim));
  call.document_ids_BL = document_ids;
  return call;
}

// Packed: one Attend call with the ids. Alone: one call per row and document, no ids, joined.
Result RunAttention(AttentionKernel& kernel, const Inputs& in, bool packed) {
  auto q = in.q.clone().requires_grad_(), k = in.k.clone().requires_grad_(), v = in.v.clone().requires_grad_();
  for (auto& p : kernel->parameters()) p.mutable_grad() = torch::Tensor();
  torch::Tensor out;
  if (packed) {
    out = kernel->Attend(q, k, v, Call(DocumentIds()));
  } else {
    std::vector<torch::Tensor> rows;
    const auto spans = DocumentSpans(DocumentIds());
    for (int64_t b = 0; b < kBatch; ++b) {
      std::vector<torch::Tensor> docs;
      for (const auto& d : spans[b]) {
        auto slice = [&](const torch::Tensor& t) { return t.narrow(0, b, 1).narrow(2, d.start, d.length); };
        docs.push_back(kernel->Attend(slice(q), slice(k), slice(v), Call({})));
      }
      rows.push_back(torch::cat(docs, 2));
    }
    out = torch::cat(rows, 0);
  }
  (out * in.weights).sum().backward();
  auto grad = [](const torch::Tensor& t) { return t.grad().defined() ? t.grad().clone() : torch::Tensor(); };
  Result r{out.detach(), {grad(q), grad(k), grad(v)}};
  for (auto& p : kernel->parameters()) r.grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  return r;
}

double RelativeError(const torch::Tensor& a, const torch::Tensor& b) {
  const auto b64 = b.to(torch::kFloat64);
  return ((a.to(torch::kFloat64) - b64).abs().max() / b64.abs().max().clamp_min(1e-30)).item<double>();
}

// The random baseline draws from its own generator: Rewind() makes the next call draw what the
// first one drew.
class DrawReplay {
 public:
  explicit DrawReplay(AttentionKernel& kernel) : generators_(kernel->forward_generators()) {
    for (auto& g : generators_) states_.push_back(g.get_state());
  }
  void Rewind() const {
    for (size_t i = 0; i < generators_.size(); ++i) {
      auto g = generators_[i];
      g.set_state(states_[i]);
    }
  }

 private:
  std::vector<at::Generator> generators_;
  std::vector<torch::Tensor> states_;
};

class DocumentMaskTest : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Kernels, DocumentMaskTest, ::testing::ValuesIn(KernelNames()),
                         [](const auto& info) { return info.param; });

TEST_P(DocumentMaskTest, PackedEqualsEachDocumentAloneInEveryForm) {
  const std::string& name = GetParam();
  // `random` draws new weights per call: packed and alone draw differently (no leakage is below).
  if (name == "random") GTEST_SKIP() << "random draws per call; see NoLeakage";
  const auto in = MakeInputs();
  for (const auto& form : FormsOf(name)) {
    auto kernel = Make(name, form);
    const auto packed = RunAttention(kernel, in, /*packed=*/true);
    const auto alone = RunAttention(kernel, in, /*packed=*/false);
    const std::string where = name + " " + (form.empty() ? "-" : form);
    ASSERT_TRUE(torch::isfinite(packed.out).all().item<bool>()) << where;
    EXPECT_LE(RelativeError(packed.out, alone.out), 1e-5) << where << " output";
    ASSERT_EQ(packed.grads.size(), alone.grads.size()) << where;
    for (size_t i = 0; i < packed.grads.size(); ++i) {
      ASSERT_EQ(packed.grads[i].defined(), alone.grads[i].defined()) << where << " grad " << i;
      if (packed.grads[i].defined()) EXPECT_LE(RelativeError(packed.grads[i], alone.grads[i]), 1e-5) << where << " grad " << i;
    }
  }
}

TEST_P(DocumentMaskTest, ChangingOneDocumentLeavesTheOthersBitIdentical) {
  const std::string& name = GetParam();
  const auto in = MakeInputs();
  auto changed = in;
  // Row 0's second document (positions 8..10) and row 1's first (0..4): every token new.
  for (auto* t : {&changed.q, &changed.k, &changed.v}) {
    *t = t->clone();
    t->select(0, 0).narrow(1, 8, 3).normal_();
    t->select(0, 1).narrow(1, 0, 5).normal_();
  }
  torch::NoGradGuard no_grad;
  for (const auto& form : FormsOf(name)) {
    auto kernel = Make(name, form);
    const DrawReplay replay(kernel);
    const auto a = kernel->Attend(in.q, in.k, in.v, Call(DocumentIds()));
    replay.Rewind();
    const auto b = kernel->Attend(changed.q, changed.k, changed.v, Call(DocumentIds()));
    const std::string where = name + " " + (form.empty() ? "-" : form);
    ASSERT_FALSE(torch::equal(a.select(0, 0).narrow(1, 8, 3), b.select(0, 0).narrow(1, 8, 3))) << where;
    EXPECT_TRUE(torch::equal(a.select(0, 0).narrow(1, 0, 8), b.select(0, 0).narrow(1, 0, 8))) << where << " row 0 before";
    EXPECT_TRUE(torch::equal(a.select(0, 0).narrow(1, 11, kLength - 11), b.select(0, 0).narrow(1, 11, kLength - 11)))
        << where << " row 0 after";
    EXPECT_TRUE(torch::equal(a.select(0, 1).narrow(1, 5, kLength - 5), b.select(0, 1).narrow(1, 5, kLength - 5)))
        << where << " row 1 after";
    EXPECT_TRUE(torch::equal(a.select(0, 2), b.select(0, 2))) << where << " row 2";
  }
}

// Without ids, Attend is forward: masking off changes nothing.
TEST_P(DocumentMaskTest, WithoutDocumentsAttendIsForward) {
  const std::string& name = GetParam();
  const auto in = MakeInputs();
  torch::NoGradGuard no_grad;
  for (const auto& form : FormsOf(name)) {
    auto kernel = Make(name, form);
    const DrawReplay replay(kernel);
    const auto a = kernel->Attend(in.q, in.k, in.v, Call({}));
    replay.Rewind();
    const auto b = kernel->forward(in.q, in.k, in.v, Call({}));
    EXPECT_TRUE(torch::equal(a, b)) << name << " " << form;
  }
}

// The chunk-parallel form masks inside its operator: the same ops for one document or many, at
// any length.
TEST(DocumentMaskOps, ChunkParallelOpCountIsIndependentOfDocumentsAndLength) {
  auto kernel = Make("darkformer", "chunk_parallel");
  torch::NoGradGuard no_grad;
  auto count = [&](int64_t length, int64_t documents) {
    torch::manual_seed(1);
    const auto q = torch::randn({1, kHeads, length, kDim}), k = torch::randn({1, kKvHeads, length, kDim}),
               v = torch::randn({1, kKvHeads, length, kDim});
    const auto ids = (torch::arange(length, torch::kLong) * documents).div(length, "floor").unsqueeze(0);
    kernel->Attend(q, k, v, Call(ids));  // the first call of a size makes its cached triangular masks
    return CountDispatchedOps([&] { kernel->Attend(q, k, v, Call(ids)); }).compute;
  };
  const auto base = count(64, 1);
  EXPECT_EQ(count(64, 7), base);
  EXPECT_EQ(count(256, 1), base);
  EXPECT_EQ(count(256, 23), base);
}

// On a CPU `auto` keeps the raw kernel for packed documents: one operator call, the kernel run
// once per document of each key row, forward and backward.
TEST(DocumentMaskOps, TheRawKernelScansEachDocumentInsideOneCall) {
  if (!Exp2LoopsVectorised()) GTEST_SKIP() << "no AVX2: the raw kernel does not run here";
  auto kernel = Make("performer", "auto");
  torch::manual_seed(1);
  const auto q = torch::randn({1, kHeads, kLength, kDim}).requires_grad_(),
             k = torch::randn({1, 1, kLength, kDim}).requires_grad_(), v = torch::randn({1, 1, kLength, kDim});
  const auto ids = DocumentIds().narrow(0, 0, 1);  // row 0: 6 documents
  const int64_t threads = torch::get_num_threads();
  torch::set_num_threads(1);  // one unit: a row's query heads are not split into parts
  const int64_t before = PositiveRowKernelRuns();
  kernel->Attend(q, k, v, Call(ids)).sum().backward();
  EXPECT_EQ(PositiveRowKernelRuns() - before, 2 * 6);
  torch::set_num_threads(threads);
}

TEST(DocumentIds, FromSeparatorsAndPositionsInsideDocuments) {
  const auto ids = torch::tensor({5, 1, 7, 1, 1, 9}, torch::kLong).unsqueeze(0);  // 1 = EOS
  const auto docs = DocumentIdsFromTokens(ids, 1);
  EXPECT_TRUE(torch::equal(docs, torch::tensor({0, 0, 1, 1, 2, 3}, torch::kLong).unsqueeze(0))) << docs;
  EXPECT_TRUE(torch::equal(PositionsInDocument(docs), torch::tensor({0, 1, 0, 1, 0, 0}, torch::kLong).unsqueeze(0)))
      << PositionsInDocument(docs);
  const auto spans = DocumentSpans(docs);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0], (std::vector<DocumentSpan>{{0, 2}, {2, 2}, {4, 1}, {5, 1}}));
}

TEST(DocumentIds, DecreasingIdsAreRefusedNamingTheRow) {
  const auto ids = torch::tensor({{0, 0, 1}, {0, 2, 1}}, torch::kLong);
  try {
    DocumentSpans(ids);
    FAIL() << "decreasing ids accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("row 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace darkformer
