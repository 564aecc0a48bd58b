// An artifact's manifest, checked as the Python loader checks it (compile/store.py), and the
// lane fields the runtime needs.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace dspark {

struct Lane {
  std::string name;
  int64_t k, block_rows, feature_size, num_layers, num_kv_heads, head_dim;
  int64_t target_vocab_size, max_context;
  at::ScalarType dtype;
  bool confidence_head;  // false: the drafter has none, and a round returns no confidences
};

struct Artifact {
  std::string directory;
  nlohmann::json manifest;
  Lane lane;
  std::vector<int64_t> buckets;
};

// The artifact at `directory` once its manifest, its key and every file's sha256 check
// out and it was built for `device` by a torch of this version; else ArtifactError.
Artifact read_artifact(const std::string& directory, const c10::Device& device);

}  // namespace dspark
