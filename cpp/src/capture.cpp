#include "capture.h"

#include <ATen/ATen.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <memory>

#ifdef DSPARK_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dspark {

namespace {

// The step's outputs with its first three (ids, confidences, the rules vector) as one byte
// tensor: on a GPU a round downloads them in one copy instead of one each.
std::vector<at::Tensor> packed(std::vector<at::Tensor> outputs) {
  std::vector<at::Tensor> bytes;
  for (size_t i = 0; i < 3; ++i) bytes.push_back(outputs[i].reshape({-1}).view(at::kByte));
  outputs.erase(outputs.begin(), outputs.begin() + 3);
  outputs.insert(outputs.begin(), at::cat(bytes));
  return outputs;
}

}  // namespace

Capture::Capture(const c10::Device& device) : device_(device) {
#ifdef DSPARK_CUDA
  if (device_.is_cuda()) pool_ = at::cuda::graph_pool_handle();  // buckets share memory
#endif
}

Call Capture::bind(Loader& loader, std::vector<at::Tensor> args) {
  if (!device_.is_cuda()) {
    for (int i = 0; i < 3; ++i) loader.run(args);
    auto outputs = std::make_shared<std::vector<at::Tensor>>();
    return [&loader, args, outputs]() -> const std::vector<at::Tensor>& {
      *outputs = packed(loader.run(args));
      return *outputs;
    };
  }
#ifdef DSPARK_CUDA
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_.index());
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device_.index());
  current.synchronize();  // the buffers were filled on the current stream
  auto graph = std::make_shared<at::cuda::CUDAGraph>();
  auto outputs = std::make_shared<std::vector<at::Tensor>>();
  {
    // warm up and capture off the default stream, as graph capture wants
    c10::cuda::CUDAStreamGuard guard(side);
    for (int i = 0; i < 3; ++i) loader.run(args, side.stream());
    side.synchronize();
    graph->capture_begin(pool_);
    *outputs = packed(loader.run(args, side.stream()));
    graph->capture_end();
  }
  return [graph, outputs]() -> const std::vector<at::Tensor>& {
    graph->replay();
    return *outputs;
  };
#else
  throw std::runtime_error("dspark_runtime was built against a torch without CUDA");
#endif
}

at::Tensor Capture::host_buffer(at::IntArrayRef shape, at::ScalarType dtype) const {
  return at::empty(shape, at::TensorOptions().dtype(dtype).pinned_memory(device_.is_cuda()));
}

void Capture::synchronize() const {
#ifdef DSPARK_CUDA
  if (device_.is_cuda()) c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
#endif
}

}  // namespace dspark
