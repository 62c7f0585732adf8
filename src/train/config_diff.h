// Comparing run configs key by key, as the run saw them: the document's keys plus the defaults
// its readers used for the keys it leaves out, so `lr: 1e-3` equals an absent lr whose default
// is 0.001. Two places need it:
//   - a resumed run must have the config its checkpoints were made with (CheckResumedConfig);
//   - data-parallel ranks must all have the same config (Trainer::JoinReplicaGroup).
// Kernel option sections are compared as written (their defaults live in the kernels).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "train/run_config.h"

namespace darkformer {

// Key path -> value as YAML text (a list as its flow text), in document order, defaults last.
using FlatConfig = std::vector<std::pair<std::string, std::string>>;
FlatConfig FlattenConfig(const YAML::Node& document, const std::map<std::string, std::string>& defaults);
inline FlatConfig FlattenConfig(const RunConfig& config) { return FlattenConfig(config.resolved, config.defaults); }

// One "key\tvalue" line per entry (values never hold a tab or newline: flow text, escaped).
std::string SerializeFlatConfig(const FlatConfig& config);
FlatConfig ParseFlatConfig(const std::string& text);

struct ConfigDifference {
  std::string key;
  std::string first, second;  // "(absent)" where one config lacks the key
};
// The first key (in `first`'s order, then `second`'s) whose values differ. Numbers compare by
// value and booleans by truth, so 1e-3 == 0.001 and yes == true. Keys equal to, or under, an
// `ignored` prefix are skipped.
std::optional<ConfigDifference> FirstDifference(const FlatConfig& first, const FlatConfig& second,
                                                const std::vector<std::string>& ignored = {});

// The keys a resumed run may change (how long and how it runs, not what it trains): those
// declared Resumable() where they are read (train/config_reference.h).
const std::vector<std::string>& KeysThatMayChangeOnResume();

// A run directory with checkpoints was made with its config.yaml: a resume whose config differs in
// any other key is refused naming the first such key and both values. Reads only: it runs before
// the run directory is locked or written, so a refused command leaves it byte-identical.
void CheckResumedConfig(const RunConfig& config);

}  // namespace darkformer
