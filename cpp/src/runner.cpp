#include <dspark/runner.h>

#include <ATen/ATen.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "artifact.h"
#include "capture.h"
#include "safetensors.h"

namespace dspark {
namespace {

// the input each entry of the step's rules vector is about (draft/checks.py's RULES)
const char* const kRules[] = {"anchor", "num_new", "anchor_pos", "anchor_pos", "features",
                              "temperature", "seed"};

std::string tuple(at::IntArrayRef shape) {  // as Python prints a shape tuple
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  return out.str() + (shape.size() == 1 ? ",)" : ")");
}

std::string list(const std::vector<int64_t>& values) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  return out.str() + "]";
}

std::string torch_name(at::ScalarType type) {
  switch (type) {
    case at::kBFloat16: return "torch.bfloat16";
    case at::kHalf: return "torch.float16";
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kLong: return "torch.int64";
    case at::kInt: return "torch.int32";
    case at::kBool: return "torch.bool";
    default: return std::string("torch.") + c10::toString(type);
  }
}

void expect(const std::string& name, const at::Tensor& t, at::IntArrayRef shape,
            at::ScalarType dtype, const c10::Device& device) {
  if (t.sizes() != shape) throw InputError(name, "shape " + tuple(t.sizes()), "shape " + tuple(shape));
  if (t.scalar_type() != dtype) {
    throw InputError(name, "dtype " + torch_name(t.scalar_type()), "dtype " + torch_name(dtype));
  }
  if (t.device() != device) {
    throw InputError(name, "device " + t.device().str(),
                     "device " + device.str() + " (the cache's)");
  }
}

std::string span(const at::Tensor& t) {
  return "[" + std::to_string(t.min().item<int64_t>()) + ", " +
         std::to_string(t.max().item<int64_t>()) + "]";
}

// Each tensor into its buffer of the same shape and dtype (a buffer passed as its own tensor
// is skipped); where all are contiguous, as bytes, which CUDA copies in one kernel.
void copy_into(const std::vector<at::Tensor>& buffers, const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> to, from;
  bool contiguous = true;
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].is_same(tensors[i])) continue;
    to.push_back(buffers[i]);
    from.push_back(tensors[i]);
    contiguous = contiguous && tensors[i].is_contiguous();
  }
  if (contiguous) {
    for (auto* list : {&to, &from}) {
      for (auto& t : *list) t = t.view(at::kByte);
    }
  }
  at::_foreach_copy_(to, from);
}

// The device a tensor allocated on `device` is on ("cuda" -> "cuda:0"): the one inputs are
// compared with and messages name, as the Python runner names its cache's.
c10::Device resolved(const c10::Device& device) {
  return at::empty({0}, at::TensorOptions().device(device)).device();
}

// Holds a runner for one call; a second call meanwhile, from another thread, is refused.
class Exclusive {
 public:
  explicit Exclusive(std::atomic<bool>& busy) : busy_(busy) {
    if (busy_.exchange(true)) {
      throw BusyError("this Runner is already running a call in another thread; a Runner is "
                      "not thread-safe: use one per thread or serialise the calls");
    }
  }
  ~Exclusive() { busy_ = false; }

 private:
  std::atomic<bool>& busy_;
};

}  // namespace

InputError::InputError(const std::string& field, const std::string& problem,
                       const std::string& allowed)
    : std::invalid_argument(field + ": " + problem + "; allowed: " + allowed), field_(field) {}

struct Runner::State {
  State(Artifact artifact_in, const c10::Device& device_in)
      : artifact(std::move(artifact_in)), device(device_in), capture(device_in) {}

  Artifact artifact;
  c10::Device device;
  Capture capture;
  std::unordered_map<std::string, at::Tensor> constants;  // user-managed: kept alive here
  std::map<int64_t, std::unique_ptr<Loader>> loaders;
  std::unique_ptr<Loader> prefill;  // the prompt's append (aoti_prefill.pt2)
  at::Tensor k_cache, v_cache;
  int64_t capacity;  // the largest anchor position (the context capacity)
  std::map<int64_t, std::vector<at::Tensor>> inputs;  // bucket -> the step's input buffers
  std::map<int64_t, Call> calls;                      // bucket -> its bound step
  std::map<int64_t, std::vector<at::Tensor>> host;    // bucket -> bytes, ids, confidences, rules
  std::map<int64_t, std::pair<at::Tensor, at::Tensor>> defaults;  // requests -> T, seed zeros
  std::map<int64_t, int64_t> rows;  // slot -> cache row; rows 0..size-1 are taken
  at::Tensor rates;                 // schedule(): SPS, on the host; or undefined
  bool by_width = false;            // schedule(): the target charges a step by its width
  int64_t lag = 0;                  // schedule(): over each request's rounds this far back
  std::map<int64_t, std::deque<at::Tensor>> history;  // slot -> its last `lag` confidences
  int64_t next_slot = 0;
  std::atomic<bool> busy{false};

  int64_t row(int64_t slot) const {
    auto it = rows.find(slot);
    if (it == rows.end()) {
      std::vector<int64_t> admitted;
      for (const auto& [s, r] : rows) admitted.push_back(s);
      throw InputError("slot", std::to_string(slot) + " is not admitted", "one of " + list(admitted));
    }
    return it->second;
  }

  int64_t bucket(int64_t requests) const {
    const auto& buckets = artifact.buckets;
    if (requests < 1 || requests > buckets.back()) {
      throw InputError("batch", std::to_string(requests) + " requests",
                       "[1, " + std::to_string(buckets.back()) + "] (the largest bucket)");
    }
    return *std::lower_bound(buckets.begin(), buckets.end(), requests);
  }

  std::unique_ptr<Loader> load(const std::string& package) {
    auto loader = std::make_unique<Loader>(artifact.directory + "/" + package, "model", true, 1,
                                           device.has_index() ? device.index() : -1);
    std::unordered_map<std::string, at::Tensor> used;
    for (const auto& fqn : loader->get_constant_fqns()) used[fqn] = constants.at(fqn);
    loader->load_constants(used, false, true, true);  // not inactive, check all, user-managed
    return loader;
  }

  // a bucket's inputs of a round in which no request takes part
  std::vector<at::Tensor> inert(int64_t bucket) const {
    const Lane& lane = artifact.lane;
    const auto on = at::TensorOptions().device(device);
    const at::Tensor zeros = at::zeros({bucket}, on.dtype(at::kLong));
    return {at::zeros({bucket, lane.k + 1, lane.feature_size}, on.dtype(lane.dtype)), zeros,
            zeros.clone(), at::full({bucket}, capacity, on.dtype(at::kLong)),
            at::zeros({bucket}, on.dtype(at::kFloat)), zeros.clone()};
  }
};

Runner::Runner(const std::string& artifact_dir, c10::Device device_in) {
  const c10::Device device = resolved(device_in);
  state_ = std::make_unique<State>(read_artifact(artifact_dir, device), device);
  State& s = *state_;
  const auto& dir = s.artifact.directory;
  const TensorFile weights = read_safetensors(dir + "/weights.safetensors");
  const TensorFile buffers = read_safetensors(dir + "/aoti_buffers.safetensors");
  nlohmann::json recipe;
  {
    std::ifstream file(dir + "/aoti_constants.json");
    recipe = nlohmann::json::parse(file);
  }
  for (const auto& [name, parts] : recipe.items()) {  // each constant, made once on the device
    std::vector<at::Tensor> pieces;
    for (const auto& part : parts) {
      pieces.push_back(weights.tensors.at(part.get<std::string>()).to(s.device));
    }
    s.constants[name] = pieces.empty() ? buffers.tensors.at(name).to(s.device)
                        : pieces.size() == 1 ? pieces[0] : at::cat(pieces, 0);
  }
  s.prefill = s.load("aoti_prefill.pt2");
  const Lane& lane = s.artifact.lane;
  const int64_t slots = lane.max_context + lane.block_rows + 1;  // context, scratch, trash
  const std::vector<int64_t> shape = {s.artifact.buckets.back(), lane.num_layers,
                                      lane.num_kv_heads, slots, lane.head_dim};
  const auto options = at::TensorOptions().dtype(lane.dtype).device(s.device);
  s.k_cache = at::zeros(shape, options);
  s.v_cache = at::zeros(shape, options);
  s.capacity = std::min(slots - lane.block_rows - 1, lane.max_context);
  for (int64_t bucket : s.artifact.buckets) {
    s.loaders[bucket] = s.load("bucket" + std::to_string(bucket) + ".pt2");
    s.inputs[bucket] = s.inert(bucket);
    std::vector<at::Tensor> args = {s.k_cache.narrow(0, 0, bucket), s.v_cache.narrow(0, 0, bucket)};
    args.insert(args.end(), s.inputs[bucket].begin(), s.inputs[bucket].end());
    s.calls[bucket] = s.capture.bind(*s.loaders[bucket], args);
    // one byte buffer for the one download, and the ids, confidences and rules in it
    const int64_t ids = bucket * lane.k * 8, confidences = bucket * lane.k * 4;
    const int64_t rules = static_cast<int64_t>(std::size(kRules));
    const at::Tensor bytes = s.capture.host_buffer({ids + confidences + rules}, at::kByte);
    s.host[bucket] = {bytes, bytes.narrow(0, 0, ids).view(at::kLong).view({bucket, lane.k}),
                      bytes.narrow(0, ids, confidences).view(at::kFloat).view({bucket, lane.k}),
                      bytes.narrow(0, ids + confidences, rules).view(at::kBool)};
  }
}

Runner::~Runner() = default;

int64_t Runner::admit() {
  State& s = *state_;
  Exclusive exclusive(s.busy);
  const auto capacity = s.artifact.buckets.back();
  if (static_cast<int64_t>(s.rows.size()) == capacity) {
    throw InputError("slots", "all " + std::to_string(capacity) + " rows in use",
                     "release a slot first (capacity = the largest bucket)");
  }
  const int64_t slot = s.next_slot++;
  s.rows[slot] = static_cast<int64_t>(s.rows.size());
  return slot;
}

void Runner::release(int64_t slot) {
  State& s = *state_;
  Exclusive exclusive(s.busy);
  const int64_t row = s.row(slot);
  s.rows.erase(slot);
  s.history.erase(slot);
  const auto last = static_cast<int64_t>(s.rows.size());
  if (row != last) {  // keep rows dense: the last request moves into the hole
    for (auto& [other, r] : s.rows) {
      if (r == last) r = row;
    }
    s.k_cache[row].copy_(s.k_cache[last]);
    s.v_cache[row].copy_(s.v_cache[last]);
  }
}

namespace {

// The InputError of the first rule of the step's rules vector `kept` (on the host) that the
// caller's inputs broke; messages as draft/checks.py's, from exact values.
void check_rules(const at::Tensor& kept, const Lane& lane, int64_t capacity,
                 const at::Tensor& features, const at::Tensor& num_new, const at::Tensor& anchor,
                 const at::Tensor& anchor_pos, const at::Tensor& temperature,
                 const at::Tensor& seed) {
  const int64_t N = features.size(1);
  const bool* ok = kept.data_ptr<bool>();
  for (int64_t rule = 0; rule < kept.numel(); ++rule) {
    if (ok[rule]) continue;
    const std::string field = kRules[rule];
    if (rule == 0) throw InputError(field, "values in " + span(anchor), "[0, " + std::to_string(lane.target_vocab_size) + ")");
    if (rule == 1) throw InputError(field, "values in " + span(num_new), "[0, " + std::to_string(N) + "] (rows of features)");
    if (rule == 2) {
      throw InputError(field, std::to_string((anchor_pos < num_new).sum().item<int64_t>()) +
                       " rows below num_new", "anchor_pos >= num_new");
    }
    if (rule == 3) {
      throw InputError(field, "up to " + std::to_string(anchor_pos.max().item<int64_t>()),
                       "<= " + std::to_string(capacity) +
                       " (the context capacity of the cache and the lane)");
    }
    if (rule == 4) {
      const at::Tensor valid = at::arange(N, num_new.options()).unsqueeze(0) < num_new.unsqueeze(1);
      const auto bad = (valid & at::isfinite(features.sum(-1, false, at::kDouble)).logical_not())
                           .sum().item<int64_t>();
      throw InputError(field, "NaN or Inf in " + std::to_string(bad) +
                       " of the rows that num_new marks valid",
                       "finite values (padding rows may hold anything)");
    }
    if (rule == 5) {
      const auto bad = ((temperature < 0) | at::isfinite(temperature).logical_not()).sum().item<int64_t>();
      throw InputError(field, std::to_string(bad) + " negative, NaN or infinite values",
                       "0 (greedy) or a finite positive number");
    }
    throw InputError(field, "values in " + span(seed), "[0, 2^32)");
  }
}

// Algorithm 1 (dspark_compile/runtime/schedule.py, verify_lengths) over the confidences of
// the round's requests, on the host where they are already: the drafts in order of their
// survival, best first, admitted while tau * SPS(B) grows, stopping at the first that does not.
at::Tensor verify_lengths(const at::Tensor& confidences, const at::Tensor& rates) {
  const int64_t R = confidences.size(0), k = confidences.size(1);
  const at::Tensor survival = confidences.to(at::kDouble).clamp(0, 1).cumprod(-1).flatten();
  const at::Tensor order = std::get<1>(survival.sort(/*stable=*/true, 0, /*descending=*/true));
  const at::Tensor gained =
      at::cat({at::zeros({1}, survival.options()), survival.index_select(0, order).cumsum(0)});
  const at::Tensor admitted = at::arange(R * k + 1, at::kLong);
  const at::Tensor value = (gained + R) * rates.index_select(0, admitted + R);
  const at::Tensor grows = value.slice(0, 1).gt(value.slice(0, 0, R * k)).to(at::kLong);
  const at::Tensor count = grows.cumprod(0).sum();
  return at::zeros({R}, at::kLong)
      .scatter_add(0, order.div(k, "floor"), admitted.slice(0, 0, R * k).lt(count).to(at::kLong));
}

// verify_width (schedule.py): every row the same number of drafts d, the one of 0 .. k that
// maximises tau(d) * SPS(d + 1), the fewest among equals.
at::Tensor verify_width(const at::Tensor& confidences, const at::Tensor& rates) {
  const int64_t R = confidences.size(0), k = confidences.size(1);
  const at::Tensor survival = confidences.to(at::kDouble).clamp(0, 1).cumprod(-1).sum(0);
  const at::Tensor gained = at::cat({at::zeros({1}, survival.options()), survival.cumsum(0)});
  const at::Tensor drafts = ((gained + R) * rates.slice(0, 1, k + 2)).argmax();
  return drafts.expand({R}).clone();
}

}  // namespace

void Runner::schedule(const std::optional<at::Tensor>& steps_per_second, bool by_width,
                      int64_t lag) {
  State& s = *state_;
  Exclusive exclusive(s.busy);
  const Lane& lane = s.artifact.lane;
  if (lag < 0) throw InputError("lag", std::to_string(lag), "0 or more rounds");
  s.history.clear();
  if (!steps_per_second) {
    s.rates = at::Tensor();
    return;
  }
  if (!lane.confidence_head) {
    throw InputError("steps_per_second", "a drafter without a confidence head",
                     "a drafter with one to schedule by");
  }
  const int64_t tokens = by_width ? lane.k + 2 : s.artifact.buckets.back() * (lane.k + 1) + 1;
  const at::Tensor& rates = *steps_per_second;
  if (!rates.defined() || rates.dim() != 1 || rates.size(0) < tokens ||
      rates.scalar_type() != at::kDouble) {
    throw InputError("steps_per_second", rates.defined() ? "shape " + tuple(rates.sizes())
                                                         : "undefined",
                     "float64 [" + std::to_string(tokens) + "] or longer (SPS at 0 tokens up)");
  }
  s.rates = rates.to(at::kCPU).contiguous();
  s.by_width = by_width;
  s.lag = lag;
}

DraftOutput Runner::draft(const at::Tensor& features, const at::Tensor& num_new,
                          const at::Tensor& anchor, const at::Tensor& anchor_pos,
                          const std::optional<at::Tensor>& temperature_in,
                          const std::optional<at::Tensor>& seed_in,
                          const std::vector<int64_t>& slots) {
  State& s = *state_;
  Exclusive exclusive(s.busy);
  const Lane& lane = s.artifact.lane;
  if (slots.empty()) throw InputError("slots", "[]", "a non-empty sequence of admitted slots");
  std::vector<int64_t> rows;
  for (int64_t slot : slots) rows.push_back(s.row(slot));
  if (std::set<int64_t>(slots.begin(), slots.end()).size() != slots.size()) {
    throw InputError("slots", list(slots) + " repeats a slot", "distinct slots");
  }
  const auto R = static_cast<int64_t>(slots.size());
  if (features.defined() && features.dim() == 3 && features.size(0) != R) {
    throw InputError("features", std::to_string(features.size(0)) + " rows for " +
                     std::to_string(R) + " slots", "one row per slot");
  }
  if (!features.defined() || features.dim() != 3 || features.size(0) == 0) {
    throw InputError("features", "shape " + tuple(features.defined() ? features.sizes()
                                                                       : at::IntArrayRef()),
                     "[R, N, feature_size] with R >= 1");
  }
  const int64_t N = features.size(1);
  expect("features", features, {R, N, lane.feature_size}, lane.dtype, s.device);
  expect("num_new", num_new, {R}, at::kLong, s.device);
  expect("anchor", anchor, {R}, at::kLong, s.device);
  expect("anchor_pos", anchor_pos, {R}, at::kLong, s.device);
  if (temperature_in) expect("temperature", *temperature_in, {R}, at::kFloat, s.device);
  if (seed_in) expect("seed", *seed_in, {R}, at::kLong, s.device);
  if (N > s.capacity) {  // the Python runner takes any row count; none past this can be valid
    throw InputError("features", std::to_string(N) + " rows a request",
                     "<= " + std::to_string(s.capacity) + " (the context capacity, as far as "
                     "the artifact's prefill goes)");
  }
  auto defaults = s.defaults.find(R);
  if (defaults == s.defaults.end()) {
    const auto on = at::TensorOptions().device(s.device);
    defaults = s.defaults.emplace(R, std::make_pair(at::zeros({R}, on.dtype(at::kFloat)),
                                                    at::zeros({R}, on.dtype(at::kLong)))).first;
  }
  const at::Tensor& temperature = temperature_in ? *temperature_in : defaults->second.first;
  const at::Tensor& seed = seed_in ? *seed_in : defaults->second.second;

  const int64_t bucket = s.bucket(static_cast<int64_t>(s.rows.size()));
  std::vector<at::Tensor> inputs = {features, num_new, anchor, anchor_pos, temperature, seed};
  std::vector<int64_t> in_order(bucket);
  for (int64_t i = 0; i < bucket; ++i) in_order[i] = i;
  const at::Tensor index = at::tensor(rows, at::kLong);
  if (rows != in_order) {  // every input row at its slot's row, inert rows elsewhere
    const at::Tensor on_device = index.to(s.device);
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::vector<int64_t> shape = inputs[i].sizes().vec();
      shape[0] = bucket;
      at::Tensor full = i == 3 ? at::full(shape, s.capacity, inputs[i].options())
                               : at::zeros(shape, inputs[i].options());
      inputs[i] = full.index_copy(0, on_device, inputs[i]);
    }
  }
  const std::vector<at::Tensor>& buffers = s.inputs.at(bucket);
  if (N != lane.k + 1) {  // a prompt: appended by the prefill, then a round of no new rows
    std::vector<at::Tensor> args = {s.k_cache.narrow(0, 0, bucket), s.v_cache.narrow(0, 0, bucket)};
    args.insert(args.end(), inputs.begin(), inputs.end());
    if (N == 0) {  // the prefill takes one row or more: one row no request marks valid,
      // and a num_new that breaks its rule (-1) where the caller's breaks [0, 0]
      args[2] = at::zeros({bucket, 1, lane.feature_size}, features.options());
      args[3] = args[3].where(args[3] == 0, -1);
    }
    const at::Tensor kept = s.prefill->run(args).at(0).to(at::kCPU);
    check_rules(kept, lane, s.capacity, features, num_new, anchor, anchor_pos, temperature, seed);
    inputs[0] = buffers[0];
    inputs[1] = at::zeros_like(inputs[1]);
  }
  copy_into(buffers, inputs);
  const std::vector<at::Tensor>& outputs = s.calls.at(bucket)();
  const std::vector<at::Tensor>& host = s.host.at(bucket);
  host[0].copy_(outputs[0], /*non_blocking=*/true);
  s.capture.synchronize();
  check_rules(host[3], lane, s.capacity, features, num_new, anchor, anchor_pos, temperature, seed);
  DraftOutput out{host[1].index_select(0, index),
                  lane.confidence_head ? host[2].index_select(0, index) : at::Tensor()};
  if (s.rates.defined()) {
    // lag 0: over this round's confidences; else over each request's of `lag` of its
    // rounds before (ones, and every draft verified, where it has none that old)
    at::Tensor scored = out.confidences;
    std::vector<int64_t> fresh;
    if (s.lag > 0) {
      std::vector<at::Tensor> old;
      for (int64_t i = 0; i < R; ++i) {
        std::deque<at::Tensor>& h = s.history[slots[i]];
        fresh.push_back(static_cast<int64_t>(h.size()) < s.lag);
        old.push_back(fresh.back() ? at::ones({lane.k}, out.confidences.options()) : h.front());
        h.push_back(out.confidences[i].clone());
        if (static_cast<int64_t>(h.size()) > s.lag) h.pop_front();
      }
      scored = at::stack(old);
    }
    out.lengths = s.by_width ? verify_width(scored, s.rates) : verify_lengths(scored, s.rates);
    if (s.lag > 0) out.lengths.masked_fill_(at::tensor(fresh, at::kLong).to(at::kBool), lane.k);
  }
  return out;
}

std::vector<int64_t> Runner::slots() const {
  std::vector<int64_t> out;
  for (const auto& [slot, row] : state_->rows) out.push_back(slot);
  return out;
}

std::vector<int64_t> Runner::buckets() const { return state_->artifact.buckets; }
int64_t Runner::k() const { return state_->artifact.lane.k; }
int64_t Runner::feature_size() const { return state_->artifact.lane.feature_size; }

}  // namespace dspark
