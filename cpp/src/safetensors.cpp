#include "safetensors.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <stdexcept>
#include <utility>
#include <vector>

namespace dspark {
namespace {

const std::vector<std::pair<std::string, at::ScalarType>>& dtypes() {
  static const std::vector<std::pair<std::string, at::ScalarType>> table = {
      {"BF16", at::kBFloat16}, {"F16", at::kHalf},  {"F32", at::kFloat}, {"F64", at::kDouble},
      {"I64", at::kLong},      {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},       {"BOOL", at::kBool}};
  return table;
}

at::ScalarType scalar_type(const std::string& name, const std::string& path) {
  for (const auto& [dtype, type] : dtypes()) {
    if (dtype == name) return type;
  }
  throw std::runtime_error(path + ": unsupported dtype " + name);
}

std::string dtype_name(at::ScalarType type) {
  for (const auto& [dtype, known] : dtypes()) {
    if (known == type) return dtype;
  }
  throw std::runtime_error(std::string("no safetensors dtype for ") + c10::toString(type));
}

}  // namespace

TensorFile read_safetensors(const std::string& path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) throw std::runtime_error(path + ": cannot open");
  const auto file_size = static_cast<int64_t>(file.tellg());
  file.seekg(0);
  uint64_t header_size = 0;  // little-endian, as on every platform torch runs on
  file.read(reinterpret_cast<char*>(&header_size), sizeof header_size);
  if (!file || header_size > static_cast<uint64_t>(file_size) - 8) {
    throw std::runtime_error(path + ": truncated header");
  }
  std::string header(header_size, '\0');
  file.read(header.data(), static_cast<std::streamsize>(header_size));
  const nlohmann::json entries = nlohmann::json::parse(header);
  const int64_t data_start = 8 + static_cast<int64_t>(header_size);

  TensorFile out;
  for (const auto& [name, entry] : entries.items()) {
    if (name == "__metadata__") {
      for (const auto& [key, value] : entry.items()) out.metadata[key] = value.get<std::string>();
      continue;
    }
    const auto shape = entry.at("shape").get<std::vector<int64_t>>();
    const auto offsets = entry.at("data_offsets").get<std::vector<int64_t>>();
    if (offsets.size() != 2 || offsets[0] < 0 || offsets[0] > offsets[1] ||
        offsets[1] > file_size - data_start) {
      throw std::runtime_error(path + ": " + name + " lies outside the file");
    }
    const auto type = scalar_type(entry.at("dtype").get<std::string>(), path);
    at::Tensor tensor = at::empty(shape, at::TensorOptions().dtype(type));  // aligned, its own
    if (tensor.nbytes() != static_cast<size_t>(offsets[1] - offsets[0])) {
      throw std::runtime_error(path + ": " + name + "'s bytes do not fit its shape");
    }
    file.seekg(data_start + offsets[0]);
    file.read(static_cast<char*>(tensor.data_ptr()), static_cast<std::streamsize>(tensor.nbytes()));
    if (!file) throw std::runtime_error(path + ": " + name + " could not be read");
    out.tensors[name] = tensor;
  }
  return out;
}

void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> order;
  int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    at::Tensor host = tensor.to(at::kCPU).contiguous();
    const auto size = static_cast<int64_t>(host.nbytes());
    header[name] = {{"dtype", dtype_name(host.scalar_type())},
                    {"shape", host.sizes().vec()},
                    {"data_offsets", {offset, offset + size}}};
    offset += size;
    order.push_back(host);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::ofstream file(path, std::ios::binary);
  const uint64_t size = text.size();
  file.write(reinterpret_cast<const char*>(&size), sizeof size);
  file.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& host : order) {  // std::map iterates in name order, as the header lists
    file.write(static_cast<const char*>(host.data_ptr()), static_cast<std::streamsize>(host.nbytes()));
  }
  if (!file) throw std::runtime_error(path + ": write failed");
}

}  // namespace dspark
