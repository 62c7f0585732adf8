// Reading torchrun's environment variables (see launch_environment.h).
#include "distributed/launch_environment.h"

#include <cstdlib>
#include <string>

#include "util/error.h"

namespace darkformer {

namespace {

std::optional<std::string> Variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

std::string Required(const char* name) {
  const auto value = Variable(name);
  DF_CHECK(value && !value->empty(), "environment variable " << name
                                         << " is not set, but WORLD_SIZE is: launch with torchrun, which sets "
                                            "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT");
  return *value;
}

int64_t Integer(const char* name, const std::string& text) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  DF_CHECK(used == text.size() && !text.empty(),
           "environment variable " << name << " must be an integer, got '" << text << "'");
  return value;
}

}  // namespace

std::optional<LaunchEnvironment> LaunchEnvironment::FromProcessEnvironment() {
  const auto world = Variable("WORLD_SIZE");
  if (!world) return std::nullopt;
  LaunchEnvironment e;
  e.world_size = Integer("WORLD_SIZE", *world);
  DF_CHECK(e.world_size >= 1, "environment variable WORLD_SIZE must be >= 1, got " << e.world_size);
  e.rank = Integer("RANK", Required("RANK"));
  DF_CHECK(e.rank >= 0 && e.rank < e.world_size,
           "environment variable RANK must be in [0, WORLD_SIZE = " << e.world_size << "), got " << e.rank);
  const auto local = Variable("LOCAL_RANK");
  e.local_rank = local ? Integer("LOCAL_RANK", *local) : 0;
  if (e.world_size == 1) return e;  // nothing to rendezvous with
  e.master_addr = Required("MASTER_ADDR");
  e.master_port = Integer("MASTER_PORT", Required("MASTER_PORT"));
  DF_CHECK(e.master_port > 0 && e.master_port < 65536,
           "environment variable MASTER_PORT must be a TCP port, got " << e.master_port);
  const auto agent = Variable("TORCHELASTIC_USE_AGENT_STORE");
  e.agent_hosts_store = agent && (*agent == "True" || *agent == "true" || *agent == "1");
  const auto restarts = Variable("TORCHELASTIC_RESTART_COUNT");
  e.restart_count = restarts ? Integer("TORCHELASTIC_RESTART_COUNT", *restarts) : 0;
  return e;
}

}  // namespace darkformer
