// Test helpers that damage HDF5 files the way a disk or a careless edit would: a byte changed
// inside a tensor's stored data, or a string attribute rewritten without its checksum.
#pragma once

#include <hdf5.h>

#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace darkformer::testing {

// The file offset and size of a dataset's first chunk (or of its contiguous data).
inline std::pair<haddr_t, hsize_t> StoredDataExtent(const std::string& path, const std::string& dataset) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t set = H5Dopen2(file, dataset.c_str(), H5P_DEFAULT);
  if (file < 0 || set < 0) throw std::runtime_error("cannot open " + path + ":" + dataset);
  haddr_t address = H5Dget_offset(set);  // contiguous layout
  hsize_t size = H5Dget_storage_size(set);
  if (address == HADDR_UNDEF) {  // chunked: the first chunk
    const hid_t space = H5Dget_space(set);
    std::vector<hsize_t> offset(H5Sget_simple_extent_ndims(space));
    unsigned mask = 0;
    H5Dget_chunk_info(set, space, 0, offset.data(), &mask, &address, &size);
    H5Sclose(space);
  }
  H5Dclose(set);
  H5Fclose(file);
  if (address == HADDR_UNDEF || size == 0) throw std::runtime_error("no stored data for " + dataset);
  return {address, size};
}

// Flips every bit of one byte in the middle of a dataset's stored data.
inline void FlipByteInTensor(const std::string& path, const std::string& dataset) {
  const auto [address, size] = StoredDataExtent(path, dataset);
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(static_cast<std::streamoff>(address + size / 2));
  char byte = 0;
  file.get(byte);
  file.seekp(static_cast<std::streamoff>(address + size / 2));
  file.put(static_cast<char>(~byte));
}

// Rewrites a root string attribute, leaving the file's "checksums" attribute as it was.
inline void RewriteRootAttribute(const std::string& path, const std::string& name, const std::string& value) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  H5Adelete(file, name.c_str());
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t attribute = H5Acreate2(file, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
  const char* text = value.c_str();
  H5Awrite(attribute, type, &text);
  H5Aclose(attribute);
  H5Sclose(space);
  H5Tclose(type);
  H5Fclose(file);
}

// Whether a dataset is stored chunked with HDF5's Fletcher32 filter.
inline bool HasFletcher32(const std::string& path, const std::string& dataset) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t set = H5Dopen2(file, dataset.c_str(), H5P_DEFAULT);
  const hid_t create = H5Dget_create_plist(set);
  bool found = false;
  for (int i = 0; i < H5Pget_nfilters(create); ++i) {
    unsigned flags = 0;
    size_t n = 0;
    unsigned config = 0;
    found = found || H5Pget_filter2(create, i, &flags, &n, nullptr, 0, nullptr, &config) == H5Z_FILTER_FLETCHER32;
  }
  H5Pclose(create);
  H5Dclose(set);
  H5Fclose(file);
  return found;
}

}  // namespace darkformer::testing
