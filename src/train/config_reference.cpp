// The reference config, key table and resume rules made from the declarations (see
// config_reference.h).
#include "train/config_reference.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <memory>

#include "train/run_config.h"

namespace darkformer {

namespace {

// The declarations as a tree, each level in first-declared order.
struct KeyNode {
  std::string name;
  const KeyDeclaration* declaration = nullptr;
  std::vector<std::unique_ptr<KeyNode>> children;

  KeyNode& ChildNamed(const std::string& child_name) {
    for (auto& child : children) {
      if (child->name == child_name) return *child;
    }
    children.push_back(std::make_unique<KeyNode>());
    children.back()->name = child_name;
    return *children.back();
  }
};

KeyNode BuildTree(const std::vector<KeyDeclaration>& keys) {
  KeyNode root;
  for (const auto& key : keys) {
    KeyNode* node = &root;
    size_t start = 0;
    while (true) {
      const auto dot = key.path.find('.', start);
      node = &node->ChildNamed(key.path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    node->declaration = &key;
  }
  return root;
}

constexpr size_t kCommentColumn = 36;

void AppendLine(std::string& out, const std::string& text, const std::string& doc) {
  out += text;
  if (!doc.empty()) out += std::string(text.size() < kCommentColumn ? kCommentColumn - text.size() : 1, ' ') + "# " + doc;
  out += "\n";
}

void RenderYaml(const KeyNode& node, int depth, std::string& out) {
  const std::string indent(2 * depth, ' ');
  const std::string doc = node.declaration ? node.declaration->doc : "";
  const bool section = node.declaration ? node.declaration->section : !node.children.empty();
  if (!section) {
    AppendLine(out, indent + node.name + ": " + node.declaration->shown, doc);
    return;
  }
  AppendLine(out, indent + node.name + ":" + (node.children.empty() ? " {}" : ""), doc);
  for (const auto& child : node.children) RenderYaml(*child, depth + 1, out);
}

std::string Cell(const std::string& text) {
  std::string out;
  for (const char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

void RenderRows(const KeyNode& node, const std::string& path, bool resumable_above, std::string& out) {
  const auto* d = node.declaration;
  const bool resumable = resumable_above || (d && d->resumable);
  if (d && !d->section) {
    out += "| `" + path + "` | `" + Cell(d->shown) + "`" + (d->required ? " (required; an example)" : "") + " | " +
           Cell(d->rule) + " | " + (resumable ? "may change" : "") + " | " + Cell(d->doc) + " |\n";
  } else if (d && node.children.empty()) {
    out += "| `" + path + "` | (no options) | | | " + Cell(d->doc) + " |\n";
  }
  for (const auto& child : node.children) RenderRows(*child, path + "." + child->name, resumable, out);
}

}  // namespace

std::vector<KeyDeclaration> DeclaredRunConfigKeys() {
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::warn);  // the read's notes are about a run, and there is none
  const auto reader = ConfigReader::Declaring();
  try {
    RunConfig::Read(reader);
  } catch (...) {
    spdlog::set_level(level);
    throw;
  }
  spdlog::set_level(level);
  return reader.declarations();
}

std::string ReferenceYaml(const std::vector<KeyDeclaration>& keys) {
  std::string out =
      "# Every run-config key with its default and one line on what it does. A run config names only\n"
      "# the keys it changes; `base: other.yaml` starts from another file (or `base: [a.yaml, b.yaml]`,\n"
      "# merged in order, later files winning); `--set a.b.c=value` overrides. Options under a kernel's\n"
      "# section (attention.<kernel>) are checked even when no layer uses that kernel.\n"
      "# Generated from the keys' declarations by `darkformer config --reference`: do not edit (a test\n"
      "# compares it). docs/config_keys.md adds each key's accepted values and resume rule.\n";
  const auto tree = BuildTree(keys);
  for (const auto& section : tree.children) {
    out += "\n";
    RenderYaml(*section, 0, out);
  }
  return out;
}

std::string KeyTableMarkdown(const std::vector<KeyDeclaration>& keys) {
  std::string out =
      "# Config keys\n\n"
      "Every run-config key: its default, the values it accepts, whether a resume may change it\n"
      "(docs/training.md), and what it does. Generated from the keys' declarations, which sit where\n"
      "each key is read, by `darkformer config --reference --markdown`: do not edit (a test compares\n"
      "it). `configs/reference.yaml` is the same list as a config file.\n";
  const auto tree = BuildTree(keys);
  for (const auto& section : tree.children) {
    out += "\n## " + section->name + "\n\n";
    if (section->declaration && !section->declaration->doc.empty()) {
      std::string doc = section->declaration->doc;
      doc[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(doc[0])));  // a sentence here
      out += doc + ".\n\n";
    }
    out += "| key | default | accepts | resume | what it does |\n|---|---|---|---|---|\n";
    for (const auto& child : section->children) {
      RenderRows(*child, section->name + "." + child->name,
                 section->declaration && section->declaration->resumable, out);
    }
  }
  return out;
}

std::vector<std::string> ResumableKeys(const std::vector<KeyDeclaration>& keys) {
  std::vector<std::string> paths;
  for (const auto& key : keys) {
    if (key.resumable) paths.push_back(key.path);
  }
  std::sort(paths.begin(), paths.end());
  // A key inside a resumable section is already covered by the section.
  std::vector<std::string> minimal;
  for (const auto& path : paths) {
    if (!minimal.empty() && path.rfind(minimal.back() + ".", 0) == 0) continue;
    minimal.push_back(path);
  }
  return minimal;
}

}  // namespace darkformer
