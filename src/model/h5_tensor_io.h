// Streaming HDF5 tensor I/O: one dataset per tensor, written from the caller's tensors and read
// into them one at a time, so saving or loading a model (or a checkpoint's optimizer state) never
// holds a second copy of all of it. The dataset layout is weights_io.h's: 16-bit floats are stored
// as their uint16 bit patterns, and every dataset carries a `dtype` string attribute. Files are
// written checksummed (h5_checksums.h) and verified while they are read.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace H5 {
class H5File;
}

namespace darkformer {

// A rough upper bound on the bytes a file will take: tensor data plus generous HDF5 metadata. It
// is compared with the free space before writing starts (see WriteH5Atomically).
class H5SizeEstimate {
 public:
  void AddTensor(const torch::Tensor& tensor) { bytes_ += tensor.nbytes() + kPerObject; }
  void AddAttribute(const std::string& value) { bytes_ += static_cast<int64_t>(value.size()) + kPerObject; }
  void AddObject() { bytes_ += kPerObject; }
  void AddBytes(int64_t bytes) { bytes_ += bytes; }
  int64_t bytes() const { return bytes_; }

 private:
  static constexpr int64_t kPerObject = 4096, kPerFile = 64 * 1024;
  int64_t bytes_ = kPerFile;
};

struct H5WriteOptions {
  // false writes the layout of files from before checksums (contiguous datasets, no checksums
  // attribute): for the benchmark and the tests that old files still load, never for users.
  bool checksums = true;
};

// The file being written inside WriteH5Atomically. Object paths may name groups ("a/b/c"); the
// groups on the way are created as needed. "" (or "/") is the file itself.
class H5Writer {
 public:
  // Writes `tensor` (any device) as dataset `name`. A CPU tensor that is contiguous is written
  // straight from its memory; any other is copied to a contiguous CPU tensor first, that one alone.
  void WriteTensor(const std::string& name, const torch::Tensor& tensor);
  // Creates group `name` (and its parents) if it does not exist yet.
  void CreateGroup(const std::string& name);
  // Attributes of the file (object "") or of a group already created.
  void WriteStringAttribute(const std::string& object, const std::string& name, const std::string& value);
  void WriteIntAttribute(const std::string& object, const std::string& name, int64_t value);
  void WriteDoubleAttribute(const std::string& object, const std::string& name, double value);
  // The file's final name (the one errors name).
  const std::string& path() const { return path_; }

 private:
  friend void WriteH5Atomically(const std::string&, const H5SizeEstimate&, const std::function<void(H5Writer&)>&,
                                const H5WriteOptions&);
  H5Writer(H5::H5File& file, std::string path, H5WriteOptions options)
      : file_(file), path_(std::move(path)), options_(options) {}
  H5::H5File& file_;
  std::string path_;  // the final name, for error messages
  H5WriteOptions options_;
  std::map<std::string, uint64_t> attribute_hashes_;  // written last, as the "checksums" attribute
};

// Runs `write` on a new HDF5 file "<path>.tmp", then syncs it and renames it over `path`: a crash
// mid-write never leaves a torn file under the final name. A full disk met halfway leaves HDF5 with
// a file it cannot close, so `size` is checked against the free space first; a write that fails
// anyway for want of space says so. Every error names `path`; the temporary file is removed.
void WriteH5Atomically(const std::string& path, const H5SizeEstimate& size,
                       const std::function<void(H5Writer&)>& write, const H5WriteOptions& options = {});

// Refuses a floating tensor holding NaN or Inf, naming the tensor and the file. Checked in slices,
// so the check needs a bounded temporary, not one the size of the tensor.
void CheckFinite(const torch::Tensor& values, const std::string& path, const std::string& name);

// What a dataset holds, from its metadata alone (no data read).
struct H5DatasetInfo {
  std::vector<int64_t> shape;
  torch::ScalarType dtype = torch::kFloat32;
};

// An HDF5 file open for reading. Errors name the file and the dataset or attribute. A checksummed
// file is verified as it is read: a dataset's Fletcher32 checksum by HDF5 on every read, a string
// attribute against the file's "checksums" attribute; a mismatch is an Error "<file>: checksum
// mismatch in tensor '<name>'" (or attribute). A file without checksums (written before they
// were added) is read unverified, with a one-line note the first time it is opened.
class H5Reader {
 public:
  explicit H5Reader(const std::string& path);
  ~H5Reader();
  H5Reader(const H5Reader&) = delete;
  H5Reader& operator=(const H5Reader&) = delete;

  const std::string& path() const { return path_; }
  // Whether a group or dataset of that path exists (its parents need not).
  bool Exists(const std::string& name) const;
  // The datasets directly under `group` ("" for the root), skipping subgroups, in name order.
  std::vector<std::string> Datasets(const std::string& group = "") const;
  // The subgroups of `group`, in name order.
  std::vector<std::string> Groups(const std::string& group) const;
  // Shape and dtype, checking that the stored HDF5 type can hold the `dtype` attribute's type (a
  // float attribute over integer data, or the reverse, is an error, never a silent conversion).
  H5DatasetInfo Info(const std::string& name) const;
  // A new tensor of the stored dtype.
  torch::Tensor Read(const std::string& name) const;
  // Reads dataset `name` into `target`, which must have its shape: straight into the target's
  // memory when that is a contiguous CPU tensor of the stored dtype, otherwise through one
  // temporary CPU tensor of the dataset's size that is then copied (and cast) in.
  void ReadInto(const std::string& name, const torch::Tensor& target) const;
  // Attributes of the file (object "") or of a group; nullopt when absent.
  std::optional<std::string> StringAttribute(const std::string& object, const std::string& name) const;
  std::optional<int64_t> IntAttribute(const std::string& object, const std::string& name) const;
  std::optional<double> DoubleAttribute(const std::string& object, const std::string& name) const;
  bool has_checksums() const { return has_checksums_; }

 private:
  // Checks a string attribute's value against the file's "checksums" attribute (when it has one).
  void VerifyAttribute(const std::string& object, const std::string& name, const std::string& value) const;

  std::string path_;
  std::unique_ptr<H5::H5File> file_;
  bool has_checksums_ = false;
  std::map<std::string, uint64_t> attribute_hashes_;
};

}  // namespace darkformer
