// Helpers shared by the model tests: fixture paths, temp dirs, running the HF converter.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "remove_tree.h"

namespace darkformer::testing {

inline std::string SourceDir() {
  const char* dir = std::getenv("DARKFORMER_SOURCE_DIR");
  return dir ? dir : DARKFORMER_TEST_SOURCE_DIR;
}

inline std::string PythonExe() {
  const char* python = std::getenv("DARKFORMER_PYTHON");
  return python ? python : DARKFORMER_TEST_PYTHON;
}

// A fresh directory under the system temp dir, removed by the caller's TempDir destructor.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    path_ = std::filesystem::temp_directory_path() /
            ("darkformer-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    RemoveTree(path_.string());
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { RemoveTree(path_.string()); }
  std::string File(const std::string& name) const { return (path_ / name).string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

// tests/fixtures/<name> (an HF checkpoint) converted to our HDF5 by tools/convert_hf_gemma.py, once
// per process: a ctest group runs several tests of a fixture in one process, and a conversion
// costs seconds (Python, torch and transformers' config). The file lives until the process ends;
// tests read it, never write it.
inline std::string ConvertedFixture(const std::string& name) {
  static const TempDir dir("fixtures");
  static std::map<std::string, std::string> converted;
  const auto found = converted.find(name);
  if (found != converted.end()) return found->second;
  const std::string out = dir.File(name + ".h5");
  const std::string command = PythonExe() + " " + SourceDir() + "/tools/convert_hf_gemma.py to-h5 " + SourceDir() +
                              "/tests/fixtures/" + name + " " + out + " > " + dir.File(name + "-convert.log") + " 2>&1";
  const int rc = std::system(command.c_str());
  EXPECT_EQ(rc, 0) << "converter failed: " << command;
  if (rc == 0) converted.emplace(name, out);
  return out;
}

}  // namespace darkformer::testing
