// A sweep's tables (see sweep_summary.h).
#include "sweep/sweep_summary.h"

#include <fstream>

#include "util/error.h"

namespace darkformer {

namespace {

std::string CsvField(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (const char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

// The row's cells after the grid values, shared by CSV and Markdown.
std::vector<std::string> ResultCells(const SweepRecord& r) {
  std::vector<std::string> cells = {RunStatusName(r.status), std::to_string(r.exit_code)};
  const auto summary = r.summary ? r.summary->Cells() : std::vector<std::string>(RunSummary::ColumnNames().size());
  cells.insert(cells.end(), summary.begin(), summary.end());
  return cells;
}

std::vector<std::string> ResultColumns() {
  std::vector<std::string> columns = {"status", "exit_code"};
  for (const auto& name : RunSummary::ColumnNames()) columns.push_back(name);
  return columns;
}

}  // namespace

void WriteSummaryCsv(const std::vector<SweepRecord>& records, const std::vector<std::string>& grid_keys,
                     const std::string& path) {
  std::ofstream out(path);
  DF_CHECK(out, "cannot write " << path);
  out << "run";
  for (const auto& key : grid_keys) out << "," << CsvField(key);
  for (const auto& column : ResultColumns()) out << "," << column;
  out << "\n";
  for (const auto& r : records) {
    out << CsvField(r.point.name);
    for (const auto& [key, value] : r.point.values) out << "," << CsvField(value.IsScalar() ? value.Scalar() : FlowYaml(value));
    for (const auto& cell : ResultCells(r)) out << "," << CsvField(cell);
    out << "\n";
  }
}

void WriteSummaryMarkdown(const std::vector<SweepRecord>& records, const std::vector<std::string>& grid_keys,
                          const std::string& path, const std::string& title) {
  std::ofstream out(path);
  DF_CHECK(out, "cannot write " << path);
  auto escape = [](std::string text) {
    std::string out;
    for (const char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
    return out;
  };
  out << "# " << title << "\n\n|";
  for (const auto& key : grid_keys) out << " `" << key << "` |";
  for (const auto& column : ResultColumns()) out << " " << column << " |";
  out << "\n|";
  for (size_t i = 0; i < grid_keys.size() + ResultColumns().size(); ++i) out << (i < grid_keys.size() ? "---|" : "--:|");
  out << "\n";
  for (const auto& r : records) {
    out << "|";
    for (const auto& [key, value] : r.point.values) out << " " << escape(value.IsScalar() ? value.Scalar() : FlowYaml(value)) << " |";
    for (const auto& cell : ResultCells(r)) out << " " << cell << " |";
    out << "\n";
  }
  out << "\nStatus: finished | diverged (stopped on a non-finite loss) | failed | partial | pending. "
         "Run names and directories are in summary.csv.\n";
}

}  // namespace darkformer
