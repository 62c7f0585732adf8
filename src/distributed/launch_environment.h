// What torchrun (or any launcher that sets the same variables) tells a worker: its rank, the
// number of ranks, and where the rendezvous store listens.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace darkformer {

struct LaunchEnvironment {
  int64_t rank = 0;         // RANK
  int64_t world_size = 1;   // WORLD_SIZE
  int64_t local_rank = 0;   // LOCAL_RANK: the GPU this worker drives
  std::string master_addr;  // MASTER_ADDR
  int64_t master_port = 0;  // MASTER_PORT
  // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent already hosts the store at
  // MASTER_ADDR:MASTER_PORT, so every worker connects as a client; otherwise rank 0 hosts it.
  bool agent_hosts_store = false;
  int64_t restart_count = 0;  // TORCHELASTIC_RESTART_COUNT: keys of an earlier attempt are not reused

  // nullopt when WORLD_SIZE is unset (a plain run); an error naming the variable when one is set
  // but malformed or another is missing.
  static std::optional<LaunchEnvironment> FromProcessEnvironment();
};

}  // namespace darkformer
