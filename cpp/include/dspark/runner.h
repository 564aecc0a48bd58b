// The C++ runtime: loads an `aoti` artifact of dspark-compile and drafts with it, with the
// contract of the Python `Runner` (dspark_compile/runtime/runner.py).
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace dspark {

// An input the draft step cannot take; field() names it. The message is the Python
// runner's InputError's: "<field>: <problem>; allowed: <allowed>".
class InputError : public std::invalid_argument {
 public:
  InputError(const std::string& field, const std::string& problem, const std::string& allowed);
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

// An artifact that is missing, partial, corrupted, of another backend or environment.
class ArtifactError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A call made while another thread is inside the same Runner (a Runner is not thread-safe).
class BusyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One round's outputs for the requested slots, in their order, on the host.
struct DraftOutput {
  at::Tensor ids;          // [R, k] int64, target vocabulary
  at::Tensor confidences;  // [R, k] float32; undefined for a drafter without a confidence head
  at::Tensor lengths;      // [R] int64 drafts to verify (0 .. k) once scheduled; else undefined
};

// A loaded artifact with its own KV cache and request slots. Every file's sha256 is checked
// before any of it is used. Each bucket's step runs on fixed input buffers and, on CUDA, as
// one CUDA-graph replay, its outputs copied to pinned host memory; a round whose features do
// not have k+1 rows (a prompt) is appended by the artifact's compiled prefill first. Not
// thread-safe: a call while another thread is inside the same Runner throws BusyError.
class Runner {
 public:
  explicit Runner(const std::string& artifact_dir, c10::Device device = c10::Device("cpu"));
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  // A new request's slot; its cache row starts empty.
  int64_t admit();
  void release(int64_t slot);
  // One round for `slots`. Omitted temperature and seed are zeros (greedy).
  DraftOutput draft(const at::Tensor& features, const at::Tensor& num_new,
                    const at::Tensor& anchor, const at::Tensor& anchor_pos,
                    const std::optional<at::Tensor>& temperature,
                    const std::optional<at::Tensor>& seed, const std::vector<int64_t>& slots);

  // From now on each round also returns its verify lengths: Algorithm 1 over the round's
  // confidences and the target's verify steps per second by tokens in a step, float64
  // [largest bucket * (k+1) + 1] from 0 tokens up (Python: StepsPerSecond.table); with
  // by_width, the width schedule over SPS by a row's tokens, [k + 2] or longer. nullopt:
  // no lengths again. lag > 0: over each request's confidences of that many of its rounds
  // before (DSpark's production variant), every draft where it has none that old. The
  // Python runner's schedule(), the same lengths.
  void schedule(const std::optional<at::Tensor>& steps_per_second, bool by_width = false,
                int64_t lag = 0);

  std::vector<int64_t> slots() const;  // the admitted slots, ascending
  std::vector<int64_t> buckets() const;
  int64_t k() const;
  int64_t feature_size() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace dspark
