// dspark-draft-cpp ARTIFACT INPUTS OUTPUTS: replays the rounds `dspark-verify record=INPUTS`
// wrote through the C++ runner and writes their ids and confidences to OUTPUTS (a refused
// round: its message, as metadata "<round>.error"), for `dspark-verify replay=OUTPUTS` to
// check against the host path.
#include <dspark/runner.h>
#include <nlohmann/json.hpp>

#include <iostream>
#include <map>
#include <string>

#include "../src/safetensors.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: dspark-draft-cpp ARTIFACT INPUTS OUTPUTS\n";
    return 2;
  }
  try {
    const dspark::TensorFile recorded = dspark::read_safetensors(argv[2]);
    const c10::Device device(recorded.metadata.at("device"));
    dspark::Runner runner(argv[1], device);
    std::map<std::string, at::Tensor> outputs;
    std::map<std::string, std::string> metadata = recorded.metadata;  // the rounds' settings
    // plan: [[bucket, requests, rounds], ...], each bucket's requests admitted, then released
    const auto plan = nlohmann::json::parse(recorded.metadata.at("plan"));
    int64_t rounds = 0;
    for (const auto& entry : plan) {
      const auto bucket = entry[0].get<int64_t>();
      std::vector<int64_t> slots;
      for (int64_t i = 0; i < entry[1].get<int64_t>(); ++i) slots.push_back(runner.admit());
      for (int64_t r = 0; r < entry[2].get<int64_t>(); ++r, ++rounds) {
        const std::string prefix = "b" + std::to_string(bucket) + ".r" + std::to_string(r) + ".";
        auto input = [&](const std::string& name) {
          return recorded.tensors.at(prefix + name).to(device);
        };
        try {
          const dspark::DraftOutput out =
              runner.draft(input("features"), input("num_new"), input("anchor"),
                           input("anchor_pos"), input("temperature"), input("seed"), slots);
          outputs[prefix + "ids"] = out.ids;
          outputs[prefix + "confidences"] = out.confidences;
        } catch (const dspark::InputError& err) {  // a refused round: its message, then on
          metadata[prefix + "error"] = err.what();
        }
      }
      for (int64_t slot : slots) runner.release(slot);
    }
    dspark::write_safetensors(argv[3], outputs, metadata);
    std::cout << "dspark-draft-cpp: " << rounds << " rounds written to " << argv[3] << "\n";
  } catch (const std::exception& err) {
    std::cerr << "dspark-draft-cpp: " << err.what() << "\n";
    return 1;
  }
  return 0;
}
