// Checksummed HDF5 layout helpers (see h5_checksums.h).
#include "model/h5_checksums.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <sstream>

#include "util/error.h"

namespace darkformer {

namespace {

thread_local bool checksum_failed = false;

herr_t InspectFrame(unsigned, const H5E_error2_t* error, void*) {
  std::string text = error->desc ? error->desc : "";
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  if (text.find("checksum") != std::string::npos) checksum_failed = true;
  return 0;
}

herr_t OnHdf5Error(hid_t stack, void*) {
  H5Ewalk2(stack, H5E_WALK_DOWNWARD, InspectFrame, nullptr);
  return 0;  // and print nothing: the caller turns the failure into one Error
}

}  // namespace

std::vector<hsize_t> ChunkDims(const std::vector<hsize_t>& dims, size_t element_bytes) {
  std::vector<hsize_t> chunk = dims;
  // Bytes of one index along dimension d: the product of the (chunked) dimensions after it.
  for (size_t d = 0; d < chunk.size(); ++d) {
    hsize_t inner = element_bytes;
    for (size_t e = d + 1; e < chunk.size(); ++e) inner *= chunk[e];
    const hsize_t fit = std::max<hsize_t>(1, static_cast<hsize_t>(kH5ChunkBytes) / std::max<hsize_t>(inner, 1));
    if (chunk[d] <= fit) break;  // the whole rest fits
    chunk[d] = fit;
    if (fit > 1 || inner <= static_cast<hsize_t>(kH5ChunkBytes)) break;
  }
  for (auto& c : chunk) c = std::max<hsize_t>(c, 1);
  return chunk;
}

std::string AttributeKey(const std::string& object, const std::string& name) {
  return object.empty() || object == "/" ? name : object + "@" + name;
}

std::string FormatAttributeChecksums(const std::map<std::string, uint64_t>& hashes) {
  std::string text;
  for (const auto& [key, hash] : hashes) text += fmt::format("{:016x} {}\n", hash, key);
  return text;
}

std::map<std::string, uint64_t> ParseAttributeChecksums(const std::string& text, const std::string& path) {
  std::map<std::string, uint64_t> hashes;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const bool hex = line.size() > 17 && line[16] == ' ' &&
                     std::all_of(line.begin(), line.begin() + 16, [](unsigned char c) { return std::isxdigit(c); });
    DF_CHECK(hex, path << ": unreadable '" << kH5ChecksumsAttribute << "' attribute (checksum mismatch in it?)");
    hashes[line.substr(17)] = std::stoull(line.substr(0, 16), nullptr, 16);
  }
  return hashes;
}

void CaptureHdf5Errors() {
  checksum_failed = false;
  H5Eset_auto2(H5E_DEFAULT, OnHdf5Error, nullptr);
}

bool Hdf5ChecksumFailed() { return checksum_failed; }

}  // namespace darkformer
