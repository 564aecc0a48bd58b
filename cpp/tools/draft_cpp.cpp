// dspark-draft-cpp ARTIFACT INPUTS OUTPUTS [--time REPEATS]: replays the rounds
// `dspark-verify record=INPUTS` wrote through the C++ runner and writes their ids and
// confidences to OUTPUTS (and their verify lengths, where INPUTS holds a
// "steps_per_second" table to schedule by, and metadata "schedule_by": "width" for a target
// that charges a step by its width, "schedule_lag": N to schedule each request by its
// confidences of N rounds before) (a refused round: its message, as metadata "<round>.error"), for
// `dspark-verify replay=OUTPUTS` to check against the host path. With --time, each bucket's
// last drafted round is drafted REPEATS times more and the wall time of each call, in
// microseconds, goes to metadata "b<bucket>.draft_us" (a JSON list); the Runner's
// construction (checks, weights, loads, capture) in seconds to "load_s".
#include <dspark/runner.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <iostream>
#include <map>
#include <string>

#include "../src/safetensors.h"

int main(int argc, char** argv) {
  const bool timed = argc == 6 && std::string(argv[4]) == "--time";
  if (argc != 4 && !timed) {
    std::cerr << "usage: dspark-draft-cpp ARTIFACT INPUTS OUTPUTS [--time REPEATS]\n";
    return 2;
  }
  try {
    const int repeats = timed ? std::stoi(argv[5]) : 0;
    const dspark::TensorFile recorded = dspark::read_safetensors(argv[2]);
    const c10::Device device(recorded.metadata.at("device"));
    const auto loading = std::chrono::steady_clock::now();
    dspark::Runner runner(argv[1], device);
    const auto sps = recorded.tensors.find("steps_per_second");
    const auto by = recorded.metadata.find("schedule_by");  // "tokens" (default) or "width"
    const auto lag = recorded.metadata.find("schedule_lag");  // rounds back; 0 by default
    if (sps != recorded.tensors.end()) {
      runner.schedule(sps->second, by != recorded.metadata.end() && by->second == "width",
                      lag != recorded.metadata.end() ? std::stoll(lag->second) : 0);
    }
    std::map<std::string, at::Tensor> outputs;
    std::map<std::string, std::string> metadata = recorded.metadata;  // the rounds' settings
    metadata["load_s"] = std::to_string(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - loading).count());
    // plan: [[bucket, requests, rounds], ...], each bucket's requests admitted, then released
    const auto plan = nlohmann::json::parse(recorded.metadata.at("plan"));
    int64_t rounds = 0;
    for (const auto& entry : plan) {
      const auto bucket = entry[0].get<int64_t>();
      std::vector<int64_t> slots;
      for (int64_t i = 0; i < entry[1].get<int64_t>(); ++i) slots.push_back(runner.admit());
      std::function<dspark::DraftOutput()> last;  // the bucket's last round that drafted
      for (int64_t r = 0; r < entry[2].get<int64_t>(); ++r, ++rounds) {
        const std::string prefix = "b" + std::to_string(bucket) + ".r" + std::to_string(r) + ".";
        std::vector<at::Tensor> in;
        for (const char* name : {"features", "num_new", "anchor", "anchor_pos", "temperature", "seed"}) {
          in.push_back(recorded.tensors.at(prefix + name).to(device));
        }
        auto round = [&runner, &slots, in] {
          return runner.draft(in[0], in[1], in[2], in[3], in[4], in[5], slots);
        };
        try {
          const dspark::DraftOutput out = round();
          outputs[prefix + "ids"] = out.ids;
          if (out.confidences.defined()) outputs[prefix + "confidences"] = out.confidences;
          if (out.lengths.defined()) outputs[prefix + "lengths"] = out.lengths;
          last = round;
        } catch (const dspark::InputError& err) {  // a refused round: its message, then on
          metadata[prefix + "error"] = err.what();
        }
      }
      if (timed && last) {
        std::vector<double> micros;
        for (int i = 0; i < repeats; ++i) {
          const auto start = std::chrono::steady_clock::now();
          last();
          micros.push_back(std::chrono::duration<double, std::micro>(
                               std::chrono::steady_clock::now() - start).count());
        }
        metadata["b" + std::to_string(bucket) + ".draft_us"] = nlohmann::json(micros).dump();
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
