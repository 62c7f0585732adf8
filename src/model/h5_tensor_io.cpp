// Streaming HDF5 tensor I/O (see h5_tensor_io.h).
#include "model/h5_tensor_io.h"

#include <H5Cpp.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <set>

#include "model/h5_checksums.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/hashing.h"

namespace darkformer {

namespace {

// How one dtype is stored: its `dtype` attribute, the HDF5 type on disk and in memory.
struct StoredType {
  torch::ScalarType dtype;
  const char* name;
  const H5::PredType* file_type;
  const H5::PredType* memory_type;
};

// 16-bit floats go to disk as uint16 bit patterns: HDF5 has no bfloat16, and this is lossless.
const std::vector<StoredType>& StoredTypes() {
  static const std::vector<StoredType> types = {
      {torch::kFloat32, "float32", &H5::PredType::IEEE_F32LE, &H5::PredType::NATIVE_FLOAT},
      {torch::kBFloat16, "bfloat16", &H5::PredType::STD_U16LE, &H5::PredType::NATIVE_UINT16},
      {torch::kFloat16, "float16", &H5::PredType::STD_U16LE, &H5::PredType::NATIVE_UINT16},
      {torch::kFloat64, "float64", &H5::PredType::IEEE_F64LE, &H5::PredType::NATIVE_DOUBLE},
      {torch::kInt64, "int64", &H5::PredType::STD_I64LE, &H5::PredType::NATIVE_INT64},
      {torch::kUInt8, "uint8", &H5::PredType::STD_U8LE, &H5::PredType::NATIVE_UINT8},
  };
  return types;
}

const StoredType& TypeOf(torch::ScalarType dtype, const std::string& what) {
  for (const auto& t : StoredTypes()) {
    if (t.dtype == dtype) return t;
  }
  Fail(what + ": cannot store dtype " + std::string(c10::toString(dtype)));
}

// HDF5's C++ API throws its own exceptions (and prints a stack unless told not to): turn them
// into our Error naming the file and, where there is one, the dataset or attribute (`what`, e.g.
// "tensor 'x'"). A failed checksum says so, whatever HDF5's top-level message.
template <typename Fn>
auto WithHdf5Errors(const std::string& path, const std::string& what, Fn&& fn) {
  CaptureHdf5Errors();
  try {
    return fn();
  } catch (const H5::Exception& e) {
    if (Hdf5ChecksumFailed()) Fail(path + ": checksum mismatch in " + (what.empty() ? "the file's HDF5 metadata" : what));
    Fail(path + ": HDF5 error in " + e.getFuncName() + ": " + e.getDetailMsg() + (what.empty() ? "" : " (" + what + ")"));
  }
}

std::string TensorWhat(const std::string& name) { return "tensor '" + name + "'"; }
std::string AttributeWhat(const std::string& object, const std::string& name) {
  return "attribute '" + AttributeKey(object, name) + "'";
}
std::string ObjectWhat(const std::string& name) { return name.empty() ? "" : "'" + name + "'"; }

// The note on a file without checksums, once per file and process.
void NoteUnverified(const std::string& path) {
  static std::mutex mutex;
  static std::set<std::string> noted;
  const std::lock_guard<std::mutex> lock(mutex);
  if (!noted.insert(std::filesystem::absolute(path).lexically_normal().string()).second) return;
  spdlog::info("{}: carries no checksums (written before they were added); read unverified. Saving it again "
               "adds them", path);
}

std::string ReadString(const H5::Attribute& attribute) {
  std::string value;
  attribute.read(attribute.getStrType(), value);
  return value;
}

// UTF-8 strings. Checksummed files hold them fixed-length, so their bytes sit in the attribute's
// (checksummed) object header; variable-length ones live in HDF5's global heap, which has no
// checksum and whose damaged object sizes make HDF5's decoder loop forever. The layout from before
// checksums wrote variable-length ones. Readers (ours, h5py) take either.
void WriteString(H5::H5Object& object, const std::string& name, const std::string& value, bool fixed_length) {
  const H5::StrType type(H5::PredType::C_S1, fixed_length ? std::max<size_t>(value.size(), 1) : H5T_VARIABLE);
  type.setCset(H5T_CSET_UTF8);
  if (fixed_length) type.setStrpad(H5T_STR_NULLPAD);
  object.createAttribute(name, type, H5::DataSpace(H5S_SCALAR)).write(type, value);
}

H5::Group OpenObjectGroup(H5::H5File& file, const std::string& object) {
  return file.openGroup(object.empty() ? "/" : object);
}

// Creates the groups on the way to `name` ("a" and "a/b" for "a/b/c"), one level at a time, so
// each existence check looks inside a group that exists.
void CreateParents(H5::H5File& file, const std::string& name, bool including_last) {
  for (size_t slash = name.find('/'); ; slash = name.find('/', slash + 1)) {
    if (slash == std::string::npos && !including_last) return;
    const std::string prefix = name.substr(0, slash);
    if (!prefix.empty() && !file.nameExists(prefix)) file.createGroup(prefix);
    if (slash == std::string::npos) return;
  }
}

void CheckFreeSpace(const std::string& path, int64_t bytes) {
  const auto dir = std::filesystem::path(path).parent_path();
  std::error_code error;
  const auto space = std::filesystem::space(dir.empty() ? "." : dir, error);
  DF_CHECK(error || static_cast<int64_t>(space.available) >= bytes,
           path << ": no space left on device: about " << bytes << " bytes needed, " << space.available
                << " bytes free in " << dir.string());
}

}  // namespace

void H5Writer::WriteTensor(const std::string& name, const torch::Tensor& tensor) {
  const auto& type = TypeOf(tensor.scalar_type(), path_ + ": tensor '" + name + "'");
  WithHdf5Errors(path_, TensorWhat(name), [&] {
    CreateParents(file_, name, /*including_last=*/false);
    // No copy for a contiguous CPU tensor (the usual case); otherwise one, of this tensor only.
    const auto cpu = tensor.detach().to(torch::kCPU).contiguous();
    std::vector<hsize_t> dims(cpu.sizes().begin(), cpu.sizes().end());
    const auto space = dims.empty() ? H5::DataSpace(H5S_SCALAR) : H5::DataSpace(static_cast<int>(dims.size()), dims.data());
    H5::DSetCreatPropList create;
    if (options_.checksums && !dims.empty() && cpu.numel() > 0) {
      const auto chunk = ChunkDims(dims, cpu.element_size());
      create.setChunk(static_cast<int>(chunk.size()), chunk.data());
      create.setFletcher32();
    } else if (options_.checksums) {
      create.setLayout(H5D_COMPACT);  // a scalar's bytes sit in its (checksummed) object header
    }
    auto dataset = file_.createDataSet(name, *type.file_type, space, create);
    if (cpu.numel() > 0) dataset.write(cpu.data_ptr(), *type.memory_type);
    WriteString(dataset, "dtype", type.name, options_.checksums);
    return 0;
  });
  attribute_hashes_[AttributeKey(name, "dtype")] = Fnv1a64(type.name);
}

void H5Writer::CreateGroup(const std::string& name) {
  WithHdf5Errors(path_, ObjectWhat(name), [&] {
    CreateParents(file_, name, /*including_last=*/true);
    return 0;
  });
}

void H5Writer::WriteStringAttribute(const std::string& object, const std::string& name, const std::string& value) {
  WithHdf5Errors(path_, AttributeWhat(object, name), [&] {
    auto group = OpenObjectGroup(file_, object);
    WriteString(group, name, value, options_.checksums);
    return 0;
  });
  attribute_hashes_[AttributeKey(object, name)] = Fnv1a64(value);
}

void H5Writer::WriteIntAttribute(const std::string& object, const std::string& name, int64_t value) {
  WithHdf5Errors(path_, AttributeWhat(object, name), [&] {
    OpenObjectGroup(file_, object)
        .createAttribute(name, H5::PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR))
        .write(H5::PredType::NATIVE_INT64, &value);
    return 0;
  });
}

void H5Writer::WriteDoubleAttribute(const std::string& object, const std::string& name, double value) {
  WithHdf5Errors(path_, AttributeWhat(object, name), [&] {
    OpenObjectGroup(file_, object)
        .createAttribute(name, H5::PredType::IEEE_F64LE, H5::DataSpace(H5S_SCALAR))
        .write(H5::PredType::NATIVE_DOUBLE, &value);
    return 0;
  });
}

void WriteH5Atomically(const std::string& path, const H5SizeEstimate& size,
                       const std::function<void(H5Writer&)>& write, const H5WriteOptions& options) {
  const std::string tmp = path + ".tmp";
  CheckFreeSpace(path, size.bytes());
  try {
    WithHdf5Errors(path, "", [&] {
      H5::FileAccPropList access;
      if (options.checksums) access.setLibverBounds(H5F_LIBVER_V110, H5F_LIBVER_V110);
      H5::H5File file(tmp, H5F_ACC_TRUNC, H5::FileCreatPropList::DEFAULT, access);
      H5Writer writer(file, path, options);
      write(writer);
      if (options.checksums) {
        auto root = file.openGroup("/");
        WriteString(root, kH5ChecksumsAttribute, FormatAttributeChecksums(writer.attribute_hashes_), true);
      }
      file.close();
      return 0;
    });
    SyncPath(tmp);
  } catch (...) {
    // HDF5 reports a full disk as a generic write failure: say what happened, and free the space.
    const int saved = errno;
    std::error_code error;
    const auto dir = std::filesystem::path(path).parent_path();
    const auto space = std::filesystem::space(dir.empty() ? "." : dir, error);
    std::filesystem::remove(tmp, error);
    if (saved == ENOSPC || (!error && space.available < (1 << 20))) {
      Fail(path + ": no space left on device (" + std::to_string(space.available) + " bytes free in " +
           dir.string() + ")");
    }
    throw;
  }
  RenameDurably(tmp, path);
}

H5Reader::H5Reader(const std::string& path) : path_(path) {
  DF_CHECK(std::filesystem::exists(path), "file not found: " << path);
  file_ = WithHdf5Errors(path_, "", [&] { return std::make_unique<H5::H5File>(path, H5F_ACC_RDONLY); });
  const std::string what = AttributeWhat("", kH5ChecksumsAttribute);
  const auto text = WithHdf5Errors(path_, what, [&]() -> std::optional<std::string> {
    const auto root = file_->openGroup("/");
    if (!root.attrExists(kH5ChecksumsAttribute)) return std::nullopt;
    return ReadString(root.openAttribute(kH5ChecksumsAttribute));
  });
  has_checksums_ = text.has_value();
  if (has_checksums_) {
    attribute_hashes_ = ParseAttributeChecksums(*text, path_);
  } else {
    NoteUnverified(path_);
  }
}

H5Reader::~H5Reader() = default;

bool H5Reader::Exists(const std::string& name) const {
  if (name.empty()) return true;
  return WithHdf5Errors(path_, ObjectWhat(name), [&] {
    for (size_t slash = name.find('/'); ; slash = name.find('/', slash + 1)) {
      if (!file_->nameExists(name.substr(0, slash))) return false;
      if (slash == std::string::npos) return true;
    }
  });
}

std::vector<std::string> H5Reader::Datasets(const std::string& group) const {
  return WithHdf5Errors(path_, ObjectWhat(group), [&] {
    const auto g = OpenObjectGroup(*file_, group);
    std::vector<std::string> names;
    for (hsize_t i = 0; i < g.getNumObjs(); ++i) {
      if (g.getObjTypeByIdx(i) == H5G_DATASET) names.push_back(g.getObjnameByIdx(i));
    }
    return names;
  });
}

std::vector<std::string> H5Reader::Groups(const std::string& group) const {
  return WithHdf5Errors(path_, ObjectWhat(group), [&] {
    const auto g = OpenObjectGroup(*file_, group);
    std::vector<std::string> names;
    for (hsize_t i = 0; i < g.getNumObjs(); ++i) {
      if (g.getObjTypeByIdx(i) == H5G_GROUP) names.push_back(g.getObjnameByIdx(i));
    }
    return names;
  });
}

H5DatasetInfo H5Reader::Info(const std::string& name) const {
  return WithHdf5Errors(path_, TensorWhat(name), [&] {
    const auto dataset = file_->openDataSet(name);
    const auto space = dataset.getSpace();
    std::vector<hsize_t> dims(space.getSimpleExtentNdims());
    space.getSimpleExtentDims(dims.data());
    const auto type_class = dataset.getTypeClass();
    const size_t type_size = dataset.getDataType().getSize();
    std::string dtype;
    if (dataset.attrExists("dtype")) {
      dtype = ReadString(dataset.openAttribute("dtype"));
      VerifyAttribute(name, "dtype", dtype);
    } else if (type_class == H5T_FLOAT) {
      dtype = type_size == 8 ? "float64" : "float32";
    } else if (type_class == H5T_INTEGER) {
      dtype = type_size == 1 ? "uint8" : "int64";
    }
    const bool bits16 = dtype == "bfloat16" || dtype == "float16";
    const bool fits = bits16 ? type_class == H5T_INTEGER && type_size == 2
                    : (dtype == "float32" || dtype == "float64") ? type_class == H5T_FLOAT
                    : (dtype == "uint8" || dtype == "int64") ? type_class == H5T_INTEGER
                                                             : false;
    const std::string stored = type_class == H5T_FLOAT     ? std::to_string(8 * type_size) + "-bit float"
                               : type_class == H5T_INTEGER ? std::to_string(8 * type_size) + "-bit integer"
                                                           : "HDF5 type class " + std::to_string(type_class);
    DF_CHECK(fits, path_ << ": tensor '" << name << "' is stored as " << stored
                         << (dtype.empty() ? std::string(" with no dtype attribute")
                                           : ", which does not hold its dtype attribute '" + dtype + "'"));
    H5DatasetInfo info;
    info.shape.assign(dims.begin(), dims.end());
    for (const auto& t : StoredTypes()) {
      if (dtype == t.name) info.dtype = t.dtype;
    }
    return info;
  });
}

torch::Tensor H5Reader::Read(const std::string& name) const {
  const auto info = Info(name);
  auto values = torch::empty(info.shape, info.dtype);
  ReadInto(name, values);
  return values;
}

void H5Reader::ReadInto(const std::string& name, const torch::Tensor& target) const {
  const auto info = Info(name);
  DF_CHECK(target.sizes() == c10::IntArrayRef(info.shape),
           path_ << ": tensor '" << name << "' has shape " << c10::IntArrayRef(info.shape)
                 << " in the file, but the destination has " << target.sizes());
  const bool direct = target.device().is_cpu() && target.is_contiguous() && target.scalar_type() == info.dtype;
  // The temporary, when needed, is the only extra memory: one tensor of this dataset's size.
  const auto buffer = direct ? target : torch::empty(info.shape, info.dtype);
  WithHdf5Errors(path_, TensorWhat(name), [&] {
    if (buffer.numel() > 0) file_->openDataSet(name).read(buffer.data_ptr(), *TypeOf(info.dtype, name).memory_type);
    return 0;
  });
  if (!direct) {
    torch::NoGradGuard no_grad;
    target.copy_(buffer);
  }
}

std::optional<std::string> H5Reader::StringAttribute(const std::string& object, const std::string& name) const {
  const auto what = AttributeWhat(object, name);
  auto value = WithHdf5Errors(path_, what, [&]() -> std::optional<std::string> {
    const auto g = OpenObjectGroup(*file_, object);
    if (!g.attrExists(name)) return std::nullopt;
    return ReadString(g.openAttribute(name));
  });
  if (value) VerifyAttribute(object, name, *value);
  return value;
}

void H5Reader::VerifyAttribute(const std::string& object, const std::string& name, const std::string& value) const {
  if (!has_checksums_) return;
  const auto what = AttributeWhat(object, name);
  const auto it = attribute_hashes_.find(AttributeKey(object, name));
  DF_CHECK(it != attribute_hashes_.end(), path_ << ": " << what << " has no checksum in the file's '"
                                                << kH5ChecksumsAttribute << "' attribute");
  DF_CHECK(it->second == Fnv1a64(value), path_ << ": checksum mismatch in " << what);
}

std::optional<int64_t> H5Reader::IntAttribute(const std::string& object, const std::string& name) const {
  return WithHdf5Errors(path_, AttributeWhat(object, name), [&]() -> std::optional<int64_t> {
    const auto g = OpenObjectGroup(*file_, object);
    if (!g.attrExists(name)) return std::nullopt;
    int64_t value = 0;
    g.openAttribute(name).read(H5::PredType::NATIVE_INT64, &value);
    return value;
  });
}

std::optional<double> H5Reader::DoubleAttribute(const std::string& object, const std::string& name) const {
  return WithHdf5Errors(path_, AttributeWhat(object, name), [&]() -> std::optional<double> {
    const auto g = OpenObjectGroup(*file_, object);
    if (!g.attrExists(name)) return std::nullopt;
    double value = 0;
    g.openAttribute(name).read(H5::PredType::NATIVE_DOUBLE, &value);
    return value;
  });
}

void CheckFinite(const torch::Tensor& values, const std::string& path, const std::string& name) {
  if (!values.is_floating_point() || values.numel() == 0) return;
  torch::NoGradGuard no_grad;
  const auto flat = values.reshape(-1);  // a view of the (contiguous) parameter or state tensor
  constexpr int64_t kSlice = int64_t{1} << 24;
  bool finite = true;
  for (int64_t start = 0; finite && start < flat.numel(); start += kSlice) {
    const auto slice = flat.slice(0, start, std::min(flat.numel(), start + kSlice));
    // A NaN or Inf makes the sum non-finite, and a sum is one vectorised pass with no mask; only a
    // non-finite sum (or finite values whose sum overflows) needs the exact test.
    finite = std::isfinite(slice.sum().item<double>()) || torch::isfinite(slice).all().item<bool>();
  }
  if (finite) return;
  const auto nan = torch::isnan(flat).sum().item<int64_t>(), inf = torch::isinf(flat).sum().item<int64_t>();
  Fail(path + ": tensor '" + name + "' holds non-finite values (" + std::to_string(nan) + " NaN, " +
       std::to_string(inf) + " Inf of " + std::to_string(flat.numel()) + ")");
}

}  // namespace darkformer
