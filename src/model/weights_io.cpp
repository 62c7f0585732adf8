// HDF5 weights I/O (see weights_io.h).
#include "model/weights_io.h"

#include <H5Cpp.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <set>

#include "util/error.h"

namespace darkformer {

namespace {

constexpr const char* kFormat = "darkformer-weights";

std::string DtypeName(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32: return "float32";
    case torch::kBFloat16: return "bfloat16";
    case torch::kFloat16: return "float16";
    case torch::kFloat64: return "float64";
    case torch::kInt64: return "int64";
    case torch::kUInt8: return "uint8";
    default: Fail(std::string("cannot store tensors of dtype ") + c10::toString(t));
  }
}

std::string ReadStringAttribute(const H5::H5Object& object, const std::string& name) {
  const auto attribute = object.openAttribute(name);
  std::string value;
  attribute.read(attribute.getStrType(), value);
  return value;
}

void WriteStringAttribute(H5::H5Object& object, const std::string& name, const std::string& value) {
  const H5::StrType type(H5::PredType::C_S1, H5T_VARIABLE);
  type.setCset(H5T_CSET_UTF8);
  auto attribute = object.createAttribute(name, type, H5::DataSpace(H5S_SCALAR));
  attribute.write(type, value);
}

// Reads a dataset as the dtype its `dtype` attribute names, after checking that the stored HDF5
// type can hold it: a float attribute over integer data (or the reverse) is an error naming the
// tensor, never a silent conversion.
torch::Tensor ReadDataset(const H5::DataSet& dataset, const std::string& name, const std::string& file) {
  const auto space = dataset.getSpace();
  std::vector<hsize_t> dims(space.getSimpleExtentNdims());
  space.getSimpleExtentDims(dims.data());
  std::vector<int64_t> shape(dims.begin(), dims.end());
  const auto type_class = dataset.getTypeClass();
  const size_t type_size = dataset.getDataType().getSize();
  const std::string stored = type_class == H5T_FLOAT     ? std::to_string(8 * type_size) + "-bit float"
                             : type_class == H5T_INTEGER ? std::to_string(8 * type_size) + "-bit integer"
                                                         : "HDF5 type class " + std::to_string(type_class);
  std::string dtype;
  if (dataset.attrExists("dtype")) {
    dtype = ReadStringAttribute(dataset, "dtype");
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
  DF_CHECK(fits, file << ": tensor '" << name << "' is stored as " << stored
                      << (dtype.empty() ? std::string(" with no dtype attribute")
                                        : ", which does not hold its dtype attribute '" + dtype + "'"));
  if (bits16) {
    auto bits = torch::empty(shape, torch::kInt16);
    dataset.read(bits.data_ptr(), H5::PredType::NATIVE_UINT16);
    return bits.view(dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat16);
  }
  const auto [torch_type, memory_type] =
      dtype == "uint8"     ? std::pair{torch::kUInt8, H5::PredType::NATIVE_UINT8}
      : dtype == "int64"   ? std::pair{torch::kInt64, H5::PredType::NATIVE_INT64}
      : dtype == "float64" ? std::pair{torch::kFloat64, H5::PredType::NATIVE_DOUBLE}
                           : std::pair{torch::kFloat32, H5::PredType::NATIVE_FLOAT};
  auto values = torch::empty(shape, torch_type);
  dataset.read(values.data_ptr(), memory_type);
  return values;
}

void WriteDataset(H5::H5File& file, const std::string& name, const torch::Tensor& tensor) {
  const auto cpu = tensor.detach().to(torch::kCPU).contiguous();
  std::vector<hsize_t> dims(cpu.sizes().begin(), cpu.sizes().end());
  const H5::DataSpace space(static_cast<int>(dims.size()), dims.data());
  const auto type = cpu.scalar_type();
  H5::DataSet dataset;
  if (type == torch::kBFloat16 || type == torch::kFloat16) {
    dataset = file.createDataSet(name, H5::PredType::STD_U16LE, space);
    dataset.write(cpu.view(torch::kInt16).data_ptr(), H5::PredType::NATIVE_UINT16);
  } else if (type == torch::kFloat32) {
    dataset = file.createDataSet(name, H5::PredType::IEEE_F32LE, space);
    dataset.write(cpu.data_ptr(), H5::PredType::NATIVE_FLOAT);
  } else if (type == torch::kFloat64) {
    dataset = file.createDataSet(name, H5::PredType::IEEE_F64LE, space);
    dataset.write(cpu.data_ptr(), H5::PredType::NATIVE_DOUBLE);
  } else if (type == torch::kUInt8) {
    dataset = file.createDataSet(name, H5::PredType::STD_U8LE, space);
    dataset.write(cpu.data_ptr(), H5::PredType::NATIVE_UINT8);
  } else if (type == torch::kInt64) {
    dataset = file.createDataSet(name, H5::PredType::STD_I64LE, space);
    dataset.write(cpu.data_ptr(), H5::PredType::NATIVE_INT64);
  } else {
    Fail("tensor '" + name + "': cannot store dtype " + std::string(c10::toString(type)));
  }
  WriteStringAttribute(dataset, "dtype", DtypeName(type));
}

// Everything the model saves: parameters and persistent buffers, by module path.
std::map<std::string, torch::Tensor> ModelState(GemmaModelImpl& model) {
  std::map<std::string, torch::Tensor> state;
  for (const auto& item : model.named_parameters()) state[item.key()] = item.value();
  for (const auto& item : model.named_buffers()) state[item.key()] = item.value();
  return state;
}

bool IsKernelState(const std::string& name) { return name.find(".kernel.") != std::string::npos; }

template <typename Fn>
auto WithHdf5Errors(const std::string& path, Fn&& fn) {
  H5::Exception::dontPrint();
  try {
    return fn();
  } catch (const H5::Exception& e) {
    Fail(path + ": HDF5 error in " + e.getFuncName() + ": " + e.getDetailMsg());
  }
}

// A full disk met halfway through an HDF5 write leaves the library with a file it cannot close
// (and noise from the C++ API's destructors), so the space is checked before writing starts.
void CheckFreeSpace(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                    const std::map<std::string, std::string>& string_attributes) {
  constexpr int64_t kPerDatasetOverhead = 4096, kFileOverhead = 64 * 1024;  // generous HDF5 metadata
  int64_t bytes = kFileOverhead;
  for (const auto& [name, tensor] : tensors) bytes += tensor.nbytes() + kPerDatasetOverhead;
  for (const auto& [name, value] : string_attributes) bytes += static_cast<int64_t>(value.size()) + kPerDatasetOverhead;
  const auto dir = std::filesystem::path(path).parent_path();
  std::error_code error;
  const auto space = std::filesystem::space(dir.empty() ? "." : dir, error);
  DF_CHECK(error || static_cast<int64_t>(space.available) >= bytes,
           path << ": no space left on device: about " << bytes << " bytes needed, " << space.available
                << " bytes free in " << dir.string());
}

}  // namespace

std::string ReadStringAttributeH5(const std::string& path, const std::string& name) {
  DF_CHECK(std::filesystem::exists(path), "weights file not found: " << path);
  return WithHdf5Errors(path, [&] {
    H5::H5File file(path, H5F_ACC_RDONLY);
    if (!file.attrExists(name)) return std::string();
    return ReadStringAttribute(file, name);
  });
}

GemmaConfig ReadWeightsConfig(const std::string& path) {
  const auto format = ReadStringAttributeH5(path, "format");
  DF_CHECK(format == kFormat, path << ": not a darkformer weights file (attribute 'format' is '" << format
                                   << "', expected '" << kFormat << "')");
  const auto yaml = ReadStringAttributeH5(path, "config_yaml");
  DF_CHECK(!yaml.empty(), path << ": missing attribute 'config_yaml'");
  return GemmaConfig::FromYamlText(yaml, path + " (attribute config_yaml)");
}

std::string ReadWeightsAttentionYaml(const std::string& path) { return ReadStringAttributeH5(path, "attention_yaml"); }

std::map<std::string, torch::Tensor> ReadTensorsH5(const std::string& path) {
  DF_CHECK(std::filesystem::exists(path), "file not found: " << path);
  return WithHdf5Errors(path, [&] {
    H5::H5File file(path, H5F_ACC_RDONLY);
    std::map<std::string, torch::Tensor> tensors;
    for (hsize_t i = 0; i < file.getNumObjs(); ++i) {
      const std::string name = file.getObjnameByIdx(i);
      if (file.getObjTypeByIdx(i) != H5G_DATASET) continue;
      tensors[name] = ReadDataset(file.openDataSet(name), name, path);
    }
    return tensors;
  });
}

torch::Tensor ReadTensorH5(const std::string& path, const std::string& dataset) {
  DF_CHECK(std::filesystem::exists(path), "file not found: " << path);
  return WithHdf5Errors(path, [&] {
    H5::H5File file(path, H5F_ACC_RDONLY);
    DF_CHECK(file.nameExists(dataset), path << ": no dataset '" << dataset << "'");
    return ReadDataset(file.openDataSet(dataset), dataset, path);
  });
}

void WriteTensorsH5(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                    const std::map<std::string, std::string>& string_attributes,
                    const std::map<std::string, int64_t>& int_attributes) {
  // Written under a temporary name and renamed: a crash mid-write never leaves a torn file.
  const std::string tmp = path + ".tmp";
  CheckFreeSpace(path, tensors, string_attributes);
  try {
    WithHdf5Errors(path, [&] {
    H5::H5File file(tmp, H5F_ACC_TRUNC);
    for (const auto& [key, value] : string_attributes) WriteStringAttribute(file, key, value);
    for (const auto& [key, value] : int_attributes) {
      file.createAttribute(key, H5::PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR))
          .write(H5::PredType::NATIVE_INT64, &value);
    }
    for (const auto& [name, tensor] : tensors) {
      // "group/name" datasets (checkpoint extras) live in groups, which loaders of weights skip.
      const auto slash = name.rfind('/');
      if (slash != std::string::npos && !file.nameExists(name.substr(0, slash))) file.createGroup(name.substr(0, slash));
      WriteDataset(file, name, tensor);
    }
    file.close();
    return 0;
    });
  } catch (const Error&) {
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
  std::filesystem::rename(tmp, path);
}

void SaveWeights(const std::string& path, GemmaModelImpl& model, const std::string& attention_yaml) {
  std::map<std::string, std::string> attributes = {
      {"format", kFormat}, {"config_yaml", model.config().ToYamlText()}, {"source", "darkformer"}};
  if (!attention_yaml.empty()) attributes["attention_yaml"] = attention_yaml;
  WriteTensorsH5(path, ModelState(model), attributes, {{"format_version", 1}});
}

void LoadWeights(const std::string& path, GemmaModelImpl& model, const WeightsLoadOptions& options) {
  const auto file_config = ReadWeightsConfig(path);
  const auto diff = model.config().Diff(file_config);
  DF_CHECK(diff.empty(), path << ": model config differs from the file's (model vs file): " << diff);
  auto file_tensors = ReadTensorsH5(path);
  auto state = ModelState(model);
  std::vector<std::string> missing, kept_init;
  for (const auto& [name, target] : state) {
    const auto it = file_tensors.find(name);
    if (it == file_tensors.end()) {
      (options.kernel_state_optional && IsKernelState(name) ? kept_init : missing).push_back(name);
      continue;
    }
    DF_CHECK(it->second.sizes() == target.sizes(),
             path << ": tensor '" << name << "' has shape " << it->second.sizes() << " in the file, but the model expects "
                  << target.sizes());
    DF_CHECK(!target.is_floating_point() || it->second.is_floating_point(),
             path << ": tensor '" << name << "' is " << c10::toString(it->second.scalar_type())
                  << " in the file, not floating point; the model's " << name << " is "
                  << c10::toString(target.scalar_type()));
  }
  if (!missing.empty()) {
    std::string list;
    for (const auto& n : missing) list += (list.empty() ? "" : ", ") + n;
    Fail(path + ": missing tensor(s): " + list);
  }
  std::vector<std::string> skipped;
  for (const auto& [name, tensor] : file_tensors) {
    if (state.count(name)) continue;
    DF_CHECK(options.kernel_state_optional && IsKernelState(name),
             path << ": unexpected tensor '" << name << "' (the model has no such parameter or buffer)");
    skipped.push_back(name);
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, target] : state) {
    const auto it = file_tensors.find(name);
    if (it != file_tensors.end()) target.copy_(it->second.to(target.options()));
  }
  if (!kept_init.empty())
    spdlog::info("{}: {} kernel tensor(s) not in the file keep their initialisation (first: {})", path,
                 kept_init.size(), kept_init.front());
  if (!skipped.empty())
    spdlog::info("{}: {} kernel tensor(s) of another kernel skipped (first: {})", path, skipped.size(), skipped.front());
}

}  // namespace darkformer
