// JsonLinesFile (util/json_lines.h): each line is on disk, read by another stream, before the
// writer is closed (what a bench killed at a stage limit keeps); a path that cannot be written is
// refused when the file is made, naming the flag and the path; an empty path writes nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "util/error.h"
#include "util/json_lines.h"

namespace darkformer {
namespace {

std::vector<std::string> LinesOf(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string TempPath(const std::string& name) {
  return "/tmp/darkformer_json_lines_" + std::to_string(::getpid()) + "_" + name;
}

TEST(JsonLinesFileTest, EachLineIsOnDiskWhenWriteReturns) {
  const auto path = TempPath("rows.jsonl");
  {
    std::ofstream(path) << "a stale row of an earlier run\n";
    JsonLinesFile json(path);
    EXPECT_TRUE(LinesOf(path).empty()) << "made, the file is truncated";
    const Json first = {{"impl", "cuda"}, {"length", 2048}, {"ms_median", 1.5}};
    json.Write(first);
    ASSERT_EQ(LinesOf(path), std::vector<std::string>{first.dump()});
    const Json second = {{"impl", "exact"}, {"length", 2048}, {"ms_median", nullptr}};
    json.Write(second);
    EXPECT_EQ(LinesOf(path), (std::vector<std::string>{first.dump(), second.dump()}));
    EXPECT_EQ(json.lines(), 2);
    EXPECT_EQ(json.path(), path);
  }
  ::unlink(path.c_str());
}

TEST(JsonLinesFileTest, EmptyPathWritesNothing) {
  JsonLinesFile json("");
  json.Write({{"row", 1}});
  EXPECT_EQ(json.lines(), 0);
}

TEST(JsonLinesFileTest, UnwritablePathIsRefusedNamingTheFlagAndThePath) {
  const auto path = TempPath("no_such_dir") + "/rows.jsonl";
  try {
    JsonLinesFile json(path, "--json");
    FAIL() << "a file in a missing directory was accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("--json"), std::string::npos) << message;
    EXPECT_NE(message.find(path), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace darkformer
