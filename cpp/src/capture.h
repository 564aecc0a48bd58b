// A step bound to fixed buffers and, on a GPU, recorded as one CUDA graph: the one place the
// C++ runtime captures (as dspark_compile/runtime/capture.py does for the Python one).
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <functional>
#include <vector>

namespace torch::inductor {
class AOTIModelPackageLoader;
}

namespace dspark {

using Loader = torch::inductor::AOTIModelPackageLoader;
using Call = std::function<const std::vector<at::Tensor>&()>;

class Capture {
 public:
  explicit Capture(const c10::Device& device);

  // `loader` on the buffers `args` (which must hold an inert round), as a call that runs it
  // on whatever they hold then. Runs it three times first (lazy initialisation: cuBLAS
  // handles, workspaces); on CUDA it then records the call as one CUDA graph, sharing one
  // memory pool with this Capture's other graphs, and each call replays it and returns the
  // same output tensors. The step's ids, confidences and rules vector come back as one byte
  // tensor (the first output), the rest after it.
  Call bind(Loader& loader, std::vector<at::Tensor> args);

  // Host buffers the outputs are copied to: pinned on CUDA, so the copies run asynchronously.
  at::Tensor host_buffer(at::IntArrayRef shape, at::ScalarType dtype) const;
  // Waits for the device's work on the current stream (nothing to wait for on the CPU).
  void synchronize() const;

 private:
  c10::Device device_;
  c10::MempoolId_t pool_{0, 0};
};

}  // namespace dspark
