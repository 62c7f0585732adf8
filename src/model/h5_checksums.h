// What protects our HDF5 files against bytes changed on disk, and the pieces h5_tensor_io.cpp
// builds that protection from:
//   - every non-empty, non-scalar dataset is chunked (chunks of at most kH5ChunkBytes, so verifying
//     one needs one bounded buffer, never a second copy of the model) with HDF5's Fletcher32
//     filter, which HDF5 verifies on every read;
//   - scalars and empty datasets are compact: their bytes live in their object header;
//   - the file is written in the 1.10 format, whose superblock, object headers and chunk indexes
//     carry HDF5's own metadata checksums (the 1.8 format still indexes chunks with B-trees that
//     have none);
//   - string attributes are fixed-length, so they sit in those checksummed object headers, never
//     in HDF5's global heap (no checksum there, and a damaged one makes HDF5 loop forever); and
//     the root attribute "checksums" holds an FNV-1a 64 hash of each, one line
//     "<16 hex digits> <key>" per attribute (key: "name" for the file's own, "object@name" for a
//     dataset's or group's), an end-to-end check of the text that does not depend on HDF5.
// Files written before this have none of it and still load, with a note (see H5Reader).
#pragma once

#include <H5Cpp.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace darkformer {

inline constexpr int64_t kH5ChunkBytes = 16 << 20;
inline constexpr const char* kH5ChecksumsAttribute = "checksums";

// Chunk dimensions for a dataset: whole trailing dimensions and as many leading rows as fit in
// kH5ChunkBytes (splitting further dimensions only when one row alone is larger).
std::vector<hsize_t> ChunkDims(const std::vector<hsize_t>& dims, size_t element_bytes);

std::string AttributeKey(const std::string& object, const std::string& name);
std::string FormatAttributeChecksums(const std::map<std::string, uint64_t>& hashes);
// Throws Error naming `path` when the text is not what FormatAttributeChecksums writes.
std::map<std::string, uint64_t> ParseAttributeChecksums(const std::string& text, const std::string& path);

// HDF5 reports a checksum failure deep in its error stack, under a generic top-level message,
// and later API calls (closing the object while an exception unwinds) clear that stack. So an
// error handler records, at the moment an HDF5 call fails, whether its stack mentions a checksum.
void CaptureHdf5Errors();          // installs the handler and forgets what it saw before
bool Hdf5ChecksumFailed();         // since the last CaptureHdf5Errors()

}  // namespace darkformer
