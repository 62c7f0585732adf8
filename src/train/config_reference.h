// What the run config's key declarations generate (util/key_spec.h): the reference config
// (configs/reference.yaml), the docs' key table (docs/config_keys.md) and the keys a resume may
// change. The declarations are collected by reading an empty document with a declaring reader,
// which builds every registered kernel so each kernel's options are declared too.
#pragma once

#include <string>
#include <vector>

#include "util/config_reader.h"

namespace darkformer {

// Every key and section of a run config, in reading order.
std::vector<KeyDeclaration> DeclaredRunConfigKeys();

// The declarations as a commented YAML document that loads as a run config.
std::string ReferenceYaml(const std::vector<KeyDeclaration>& keys);
// One Markdown table per top-level section: key, default, accepted values, resume, doc.
std::string KeyTableMarkdown(const std::vector<KeyDeclaration>& keys);
// Key paths a resume may change (a resumable section stands for every key in it), sorted.
std::vector<std::string> ResumableKeys(const std::vector<KeyDeclaration>& keys);

}  // namespace darkformer
