// torchrun's environment: absent means a plain run; present but malformed is an error naming the
// variable.
#include "distributed/launch_environment.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "util/error.h"

namespace darkformer {
namespace {

using Vars = std::map<std::string, std::string>;

// Sets the given variables (and clears torchrun's others) for one test, restoring them after.
class ScopedEnvironment {
 public:
  explicit ScopedEnvironment(const std::map<std::string, std::string>& values) {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                             "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT"}) {
      if (const char* old = std::getenv(name)) saved_[name] = old;
      unsetenv(name);
    }
    for (const auto& [k, v] : values) setenv(k.c_str(), v.c_str(), 1);
  }
  ~ScopedEnvironment() {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                             "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT"}) {
      unsetenv(name);
    }
    for (const auto& [k, v] : saved_) setenv(k.c_str(), v.c_str(), 1);
  }

 private:
  std::map<std::string, std::string> saved_;
};

std::string ErrorOf(const std::map<std::string, std::string>& values) {
  ScopedEnvironment env(values);
  try {
    LaunchEnvironment::FromProcessEnvironment();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchEnvironment, AbsentWithoutWorldSize) {
  ScopedEnvironment env(Vars{{"RANK", "3"}});
  EXPECT_FALSE(LaunchEnvironment::FromProcessEnvironment().has_value());
}

TEST(LaunchEnvironment, ReadsTorchrunsVariables) {
  ScopedEnvironment env(Vars{{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.0.0.2"},
                         {"MASTER_PORT", "29500"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                         {"TORCHELASTIC_RESTART_COUNT", "2"}});
  const auto e = LaunchEnvironment::FromProcessEnvironment();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->rank, 1);
  EXPECT_EQ(e->world_size, 4);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->master_addr, "10.0.0.2");
  EXPECT_EQ(e->master_port, 29500);
  EXPECT_TRUE(e->agent_hosts_store);
  EXPECT_EQ(e->restart_count, 2);
}

TEST(LaunchEnvironment, OneRankNeedsNoRendezvous) {
  ScopedEnvironment env(Vars{{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  const auto e = LaunchEnvironment::FromProcessEnvironment();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->world_size, 1);
}

TEST(LaunchEnvironment, MalformedValuesNameTheirVariable) {
  EXPECT_NE(ErrorOf({{"WORLD_SIZE", "two"}}).find("WORLD_SIZE"), std::string::npos);
  EXPECT_NE(ErrorOf({{"WORLD_SIZE", "2"}}).find("RANK is not set"), std::string::npos);
  EXPECT_NE(ErrorOf({{"WORLD_SIZE", "2"}, {"RANK", "2"}}).find("RANK must be in [0, WORLD_SIZE = 2)"),
            std::string::npos);
  EXPECT_NE(ErrorOf({{"WORLD_SIZE", "2"}, {"RANK", "0"}}).find("MASTER_ADDR"), std::string::npos);
  EXPECT_NE(ErrorOf({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "99999"}})
                .find("MASTER_PORT"),
            std::string::npos);
}

}  // namespace
}  // namespace darkformer
