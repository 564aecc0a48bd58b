// safetensors files, read and written with nlohmann::json for the header.
#pragma once

#include <ATen/Tensor.h>

#include <map>
#include <string>

namespace dspark {

struct TensorFile {
  std::map<std::string, at::Tensor> tensors;  // on the CPU, sharing one buffer
  std::map<std::string, std::string> metadata;
};

TensorFile read_safetensors(const std::string& path);
void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace dspark
