// summary.json reading and writing, and its table cells (see run_summary.h).
#include "train/run_summary.h"

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

namespace darkformer {

Json RunSummary::ToJson() const {
  Json json = Json::object();
  VisitFields([&](const char* name, const auto& field, int) { json[name] = field; }, *this);
  return json;
}

RunSummary RunSummary::FromJson(const Json& json) {
  RunSummary s;
  VisitFields([&](const char* name, auto& field, int) { field = JsonGet(json, name, field); }, s);
  return s;
}

std::vector<std::string> RunSummary::ColumnNames() {
  std::vector<std::string> names;
  RunSummary s;
  VisitFields([&](const char* name, const auto&, int) { names.push_back(name); }, s);
  return names;
}

std::vector<std::string> RunSummary::Cells() const {
  std::vector<std::string> cells;
  VisitFields(
      [&](const char*, const auto& field, int decimals) {
        using T = std::decay_t<decltype(field)>;
        std::ostringstream cell;
        if constexpr (std::is_same_v<T, bool>) {
          cell << (field ? "true" : "false");
        } else if constexpr (std::is_floating_point_v<T>) {
          cell << std::fixed << std::setprecision(decimals) << field;
        } else {
          cell << field;
        }
        cells.push_back(cell.str());
      },
      *this);
  return cells;
}

std::optional<RunSummary> ReadRunSummary(const std::string& run_dir) {
  const auto path = std::filesystem::path(run_dir) / "summary.json";
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const auto json = Json::parse(in, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return std::nullopt;  // a torn write or a stray file
  try {
    return RunSummary::FromJson(json);
  } catch (const Json::exception&) {
    return std::nullopt;  // a field of the wrong type: not ours
  }
}

}  // namespace darkformer
