// HDF5 weights I/O (see weights_io.h).
#include "model/weights_io.h"

#include <H5Cpp.h>
#include <spdlog/spdlog.h>

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

torch::Tensor ReadDataset(const H5::DataSet& dataset, const std::string& name, const std::string& file) {
  const auto space = dataset.getSpace();
  std::vector<hsize_t> dims(space.getSimpleExtentNdims());
  space.getSimpleExtentDims(dims.data());
  std::vector<int64_t> shape(dims.begin(), dims.end());
  std::string dtype = "float32";
  if (dataset.attrExists("dtype")) dtype = ReadStringAttribute(dataset, "dtype");
  const auto type_class = dataset.getTypeClass();
  if (dtype == "bfloat16" || dtype == "float16") {
    auto bits = torch::empty(shape, torch::kInt16);
    dataset.read(bits.data_ptr(), H5::PredType::NATIVE_UINT16);
    return bits.view(dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat16);
  }
  if (dtype == "uint8") {
    auto values = torch::empty(shape, torch::kUInt8);
    dataset.read(values.data_ptr(), H5::PredType::NATIVE_UINT8);
    return values;
  }
  if (dtype == "int64" || type_class == H5T_INTEGER) {
    auto values = torch::empty(shape, torch::kInt64);
    dataset.read(values.data_ptr(), H5::PredType::NATIVE_INT64);
    return values;
  }
  DF_CHECK(dtype == "float32" || dtype == "float64",
           file << ": tensor '" << name << "' has unsupported dtype attribute '" << dtype << "'");
  if (dtype == "float64") {
    auto values = torch::empty(shape, torch::kFloat64);
    dataset.read(values.data_ptr(), H5::PredType::NATIVE_DOUBLE);
    return values;
  }
  auto values = torch::empty(shape, torch::kFloat32);
  dataset.read(values.data_ptr(), H5::PredType::NATIVE_FLOAT);
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
