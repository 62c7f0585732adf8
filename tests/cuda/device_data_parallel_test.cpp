// Data parallelism on the test device: a one-rank process group (NCCL on CUDA, Gloo on the CPU)
// initialises, sums, and runs one data-parallel backward whose gradients equal a plain backward's
// bit for bit (the average over one rank is the rank's own).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cuda/test_device.h"
#include "distributed/data_parallel.h"
#include "model/gemma_model.h"
#include "tiny_gemma.h"

namespace darkformer {
namespace {

// A port nobody listens on now: the kernel's pick for port 0.
int64_t FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

GemmaModel TinyModel(torch::Device device) {
  GemmaModel model(testing::TinyGemmaConfig(2), testing::TinyAttentionConfig("darkformer", 2));
  model->InitializeWeights(0.2, 5);
  model->to(device);
  return model;
}

TEST(DeviceDataParallelTest, OneRankGroupSumsAndStepsAsAPlainStep) {
  const auto device = testing::TestDevice();
  LaunchEnvironment env;
  env.master_addr = "127.0.0.1";
  env.master_port = FreePort();
  DistributedConfig config;
  config.timeout_s = 60;
  auto group = DataParallel::Join(config, env, device, /*even_alone=*/true);
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->backend_name(), device.is_cuda() ? "nccl" : "gloo");
  EXPECT_EQ(group->Sum({1.5, -2.0}, "test sum"), (std::vector<double>{1.5, -2.0}));

  torch::manual_seed(9);
  const auto ids = torch::randint(0, 96, {2, 24}, torch::kLong).to(device);
  auto plain = TinyModel(device), parallel = TinyModel(device);
  CausalLmLoss(plain->forward(ids), ShiftedLabels(ids)).backward();
  group->WatchGradients(parallel->named_parameters(), /*search_unused=*/false);
  group->Backward(CausalLmLoss(parallel->forward(ids), ShiftedLabels(ids)), /*synchronise=*/true);
  const auto want = plain->named_parameters(), got = parallel->named_parameters();
  for (const auto& item : want) {
    ASSERT_TRUE(got[item.key()].grad().defined()) << item.key();
    EXPECT_TRUE(torch::equal(got[item.key()].grad(), item.value().grad())) << item.key() << " on " << device;
  }
}

}  // namespace
}  // namespace darkformer
