// Crash-safe file output: content goes to "<path>.tmp", is flushed to disk, then renamed over
// <path>, so a reader sees the old file or the complete new one, never a half-written one.
#pragma once

#include <string>

namespace darkformer {

// Writes `content` to `path` atomically (tmp file, fsync, rename, fsync of the directory).
void WriteFileAtomically(const std::string& path, const std::string& content);

// fsync()s the open file or directory at `path`; throws naming it on failure.
void SyncPath(const std::string& path);

// Renames `from` to `to` and syncs the containing directory; throws naming both on failure.
void RenameDurably(const std::string& from, const std::string& to);

}  // namespace darkformer
