#include "artifact.h"

#include <ATen/Version.h>
#include <dspark/runner.h>
#include <openssl/evp.h>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <memory>
#include <sstream>
#include <thread>

namespace dspark {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kFormatVersion = 3;  // compile/key.py's FORMAT_VERSION
const char* const kManifest = "manifest.json";
const char* const kWeights = "weights.safetensors";

// json.dumps(value, sort_keys=True) as Python writes it, for messages that quote a value as
// the Python loader's do.
std::string python_dumps(const json& value) {
  std::string out;
  if (value.is_object()) {  // nlohmann's objects iterate in key order
    out = "{";
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (it != value.begin()) out += ", ";
      out += json(it.key()).dump(-1, ' ', true) + ": " + python_dumps(it.value());
    }
    return out + "}";
  }
  if (value.is_array()) {
    out = "[";
    for (size_t i = 0; i < value.size(); ++i) out += (i ? ", " : "") + python_dumps(value[i]);
    return out + "]";
  }
  return value.dump(-1, ' ', true);
}

std::string python_repr(const json& value) {
  if (value.is_null()) return "None";
  if (value.is_string()) return "'" + value.get<std::string>() + "'";
  return python_dumps(value);
}

std::string hex(const unsigned char* bytes, unsigned size) {
  std::ostringstream out;
  for (unsigned i = 0; i < size; ++i) {
    out << std::hex << std::setw(2) << std::setfill('0') << static_cast<int>(bytes[i]);
  }
  return out.str();
}

std::string sha256_text(const std::string& text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned size = 0;
  EVP_Digest(text.data(), text.size(), digest, &size, EVP_sha256(), nullptr);
  return hex(digest, size);
}

// sha256 of `length` bytes of the file from `offset` (to the end when length < 0).
std::string sha256_file(const fs::path& path, int64_t offset, int64_t length) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::ifstream file(path, std::ios::binary);
  file.seekg(offset);
  std::vector<char> piece(1 << 20);
  while (file && length != 0) {
    const auto want = length < 0 ? static_cast<int64_t>(piece.size())
                                 : std::min<int64_t>(length, piece.size());
    file.read(piece.data(), want);
    const auto got = file.gcount();
    if (got <= 0) break;
    EVP_DigestUpdate(ctx.get(), piece.data(), got);
    if (length > 0) length -= got;
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned size = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &size);
  return hex(digest, size);
}

bool plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of("/\\") == std::string::npos;
}

void check_schema(const json& manifest, const std::string& path) {
  if (!manifest.is_object()) throw ArtifactError(path + ": manifest is not a JSON object");
  const std::vector<std::pair<std::string, std::string>> fields = {
      {"format_version", "int"}, {"key", "str"},       {"key_text", "str"},
      {"lane", "dict"},          {"weights_sha256", "str"}, {"backend", "str"},
      {"buckets", "list"},       {"with_probs", "bool"}, {"dtype", "str"},
      {"k", "int"},              {"env", "dict"},      {"files", "dict"}};
  for (const auto& [field, kind] : fields) {
    const bool ok = manifest.contains(field) && (
        kind == "int" ? manifest[field].is_number_integer() || manifest[field].is_boolean()
        : kind == "str" ? manifest[field].is_string()
        : kind == "dict" ? manifest[field].is_object()
        : kind == "list" ? manifest[field].is_array() : manifest[field].is_boolean());
    if (!ok) throw ArtifactError(path + ": field '" + field + "' missing or not a " + kind);
  }
  const auto& buckets = manifest["buckets"];
  if (buckets.empty() || !std::all_of(buckets.begin(), buckets.end(), [](const json& b) {
        return b.is_number_integer() && b.get<int64_t>() >= 1;
      })) {
    throw ArtifactError(path + ": buckets must be positive integers, got " + python_dumps(buckets));
  }
  for (const auto& [name, sha] : manifest["files"].items()) {
    if (!sha.is_string()) throw ArtifactError(path + ": files must map names to sha256 strings");
  }
  const json chunks = manifest.value("chunks", json::object());
  bool chunks_ok = chunks.is_object();
  if (chunks_ok) {
    for (const auto& item : chunks.items()) {
      const json& record = item.value();
      const auto integer = [&](const char* field) {
        return record.contains(field) && record[field].is_number_integer();
      };
      chunks_ok = chunks_ok && manifest["files"].contains(item.key()) && record.is_object() &&
                  integer("bytes") && integer("size") && record.contains("sha256") &&
                  record["sha256"].is_array();
      if (!chunks_ok) break;
      const auto bytes = record["bytes"].get<int64_t>(), size = record["size"].get<int64_t>();
      chunks_ok = bytes > 0 &&
                  static_cast<int64_t>(record["sha256"].size()) == (size + bytes - 1) / bytes &&
                  std::all_of(record["sha256"].begin(), record["sha256"].end(),
                              [](const json& sha) { return sha.is_string(); });
    }
  }
  if (!chunks_ok) {
    throw ArtifactError(path + ": chunks must map listed files to their chunk size, file size "
                        "and one sha256 a chunk");
  }
}

// What the compiled code depends on here: the torch it links, the device type, the CPU's ISA.
std::vector<std::string> environment_differences(const json& env, const c10::Device& device) {
  std::vector<std::pair<std::string, std::string>> running = {
      {"torch", TORCH_VERSION}, {"device_type", c10::DeviceTypeName(device.type(), true)}};
  if (device.is_cpu()) running.emplace_back("cpu_isa", at::get_cpu_capability());
  std::vector<std::string> differs;
  for (const auto& [name, value] : running) {
    const json built = env.value(name, json());
    std::string seen = built.is_string() ? built.get<std::string>() : "";
    if (name == "torch") seen = seen.substr(0, seen.find('+'));  // the local tag: a Python build's
    if (seen != value) {
      differs.push_back(name + ": artifact " + python_repr(built) + ", running '" + value + "'");
    }
  }
  return differs;
}

// The first file, in manifest order, whose bytes fail their sha256 (a chunked file: its size
// and every chunk); empty if none. The files and chunks are hashed on a thread each, up to
// the machine's cores, as the Python loader does.
std::string first_failing(const fs::path& directory, const json& files, const json& chunks) {
  struct Check {
    std::string name;
    int64_t offset, length;  // length < 0: to the end of the file
    std::string sha256;      // empty: fails (a chunked file of the wrong size)
  };
  std::vector<Check> checks;
  for (const auto& [name, sha] : files.items()) {
    if (!chunks.contains(name)) {
      checks.push_back({name, 0, -1, sha.get<std::string>()});
      continue;
    }
    const auto& record = chunks[name];
    if (static_cast<int64_t>(fs::file_size(directory / name)) != record["size"].get<int64_t>()) {
      checks.push_back({name, 0, 0, ""});
      continue;
    }
    const auto bytes = record["bytes"].get<int64_t>();
    for (size_t i = 0; i < record["sha256"].size(); ++i) {
      checks.push_back({name, static_cast<int64_t>(i) * bytes, bytes,
                        record["sha256"][i].get<std::string>()});
    }
  }
  std::vector<char> passed(checks.size(), 0);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < checks.size();) {
      const Check& c = checks[i];
      passed[i] = !c.sha256.empty() &&
                  sha256_file(directory / c.name, c.offset, c.length) == c.sha256;
    }
  };
  std::vector<std::thread> threads;
  const unsigned count = std::clamp(std::thread::hardware_concurrency(), 1u, 32u);
  for (unsigned t = 0; t < count; ++t) threads.emplace_back(work);
  for (auto& thread : threads) thread.join();
  for (size_t i = 0; i < checks.size(); ++i) {
    if (!passed[i]) return checks[i].name;
  }
  return "";
}

Lane lane_of(const json& lane) {
  const auto k = lane.at("k").get<int64_t>();
  const auto dtype = lane.at("dtype").get<std::string>();
  return Lane{lane.at("name").get<std::string>(),
              k,
              k + (lane.at("layout").get<std::string>() == "one_plus_k"),
              static_cast<int64_t>(lane.at("target_layer_ids").size()) *
                  lane.at("hidden_size").get<int64_t>(),
              lane.at("num_layers").get<int64_t>(),
              lane.at("num_kv_heads").get<int64_t>(),
              lane.at("head_dim").get<int64_t>(),
              lane.at("target_vocab_size").get<int64_t>(),
              lane.at("max_context").get<int64_t>(),
              dtype == "bfloat16" ? at::kBFloat16 : dtype == "float16" ? at::kHalf
              : dtype == "float32" ? at::kFloat : at::kDouble,
              lane.value("confidence_head", true)};
}

}  // namespace

Artifact read_artifact(const std::string& directory_name, const c10::Device& device) {
  const fs::path directory = fs::path(directory_name).lexically_normal();
  std::string dir = directory.string();
  if (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string path = (directory / kManifest).string();
  if (!fs::is_regular_file(path)) {
    throw ArtifactError(dir + ": no manifest.json: not an artifact, or a half-written one (builds "
                        "become visible only when complete)");
  }
  json manifest;
  try {
    std::ifstream file(path);
    manifest = json::parse(file);
  } catch (const std::exception& err) {
    throw ArtifactError(path + ": unreadable manifest: " + err.what());
  }
  check_schema(manifest, path);
  const auto format = manifest["format_version"].get<int64_t>();
  if (format != kFormatVersion) {
    throw ArtifactError(path + ": artifact format " + std::to_string(format) +
                        ", this dspark-compile reads format " + std::to_string(kFormatVersion) +
                        "; rebuild it");
  }
  const auto differs = environment_differences(manifest["env"], device);
  if (!differs.empty()) {
    std::string joined;
    for (const auto& d : differs) joined += (joined.empty() ? "" : "; ") + d;
    throw ArtifactError(dir + " was built in another environment; rebuild it here. Differs: " +
                        joined);
  }
  // the key's text, as the manifest carries it: its sha256 is the key, and it says what the
  // manifest's fields say (compared as values, never written out again)
  const json fields = {kFormatVersion,       manifest["lane"], manifest["weights_sha256"],
                       manifest["backend"],  manifest["buckets"], manifest["env"],
                       manifest["with_probs"]};
  const std::string key_text = manifest["key_text"].get<std::string>();
  if (sha256_text(key_text) != manifest["key"].get<std::string>() ||
      json::parse(key_text, nullptr, false) != fields) {
    throw ArtifactError(path + ": the manifest does not match its key: it was edited or "
                        "damaged; rebuild the artifact");
  }
  for (const auto& [name, sha] : manifest["files"].items()) {
    if (!plain_name(name)) {
      throw ArtifactError(path + ": file name '" + name + "' points outside the artifact");
    }
    if (!fs::is_regular_file(directory / name)) throw ArtifactError(dir + ": " + name + " is missing");
  }
  const std::string failed =
      first_failing(directory, manifest["files"], manifest.value("chunks", json::object()));
  if (!failed.empty()) {
    throw ArtifactError(dir + ": " + failed + " fails its sha256 check (corrupted or modified); "
                        "rebuild the artifact");
  }
  if (!manifest["files"].contains(kWeights)) {
    throw ArtifactError(path + ": lists no " + std::string(kWeights));
  }
  if (manifest["backend"] != "aoti") {
    throw ArtifactError(dir + ": a " + manifest["backend"].get<std::string>() +
                        " artifact; the C++ runtime loads aoti artifacts");
  }
  return Artifact{dir, manifest, lane_of(manifest["lane"]),
                  manifest["buckets"].get<std::vector<int64_t>>()};
}

}  // namespace dspark
