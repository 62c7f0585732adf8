// Crash-safe file output (see atomic_file.h).
#include "util/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "util/error.h"

namespace darkformer {

void SyncPath(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  DF_CHECK(fd >= 0, path << ": cannot open to sync: " << std::strerror(errno));
  int rc = ::fsync(fd);
  int saved = errno;
  ::close(fd);
  // Some filesystems refuse fsync on a directory (EINVAL); the rename is still atomic there.
  DF_CHECK(rc == 0 || saved == EINVAL, path << ": fsync failed: " << std::strerror(saved));
}

void RenameDurably(const std::string& from, const std::string& to) {
  DF_CHECK(std::rename(from.c_str(), to.c_str()) == 0,
           "cannot rename " << from << " to " << to << ": " << std::strerror(errno));
  std::string dir = std::filesystem::path(to).parent_path().string();
  SyncPath(dir.empty() ? "." : dir);
}

void WriteFileAtomically(const std::string& path, const std::string& content) {
  std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  DF_CHECK(f != nullptr, tmp << ": cannot create: " << std::strerror(errno));
  bool ok = std::fwrite(content.data(), 1, content.size(), f) == content.size();
  ok = std::fflush(f) == 0 && ok;
  ok = ::fsync(::fileno(f)) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    Fail(tmp + ": write failed: " + std::strerror(errno));
  }
  RenameDurably(tmp, path);
}

}  // namespace darkformer
