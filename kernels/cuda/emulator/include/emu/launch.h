// A kernel launch in the CUDA emulator: what `kernel<<<grid, block, shared, stream>>>(args...)`
// becomes (ampgrad::cuda::launch in kernels/cuda/launch.cuh calls emu::launch here).
//
// The arguments are converted to the kernel's parameter types and copied when the launch
// is made, as the runtime copies them; every CUDA thread of the launch then calls the
// kernel with its own copy of them. The configuration is checked as the driver checks it
// (src/runtime.cpp), the launch queued on its stream.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "emu/stream.h"
#include "emu/types.h"

namespace ampgrad::emu {

/// One launch: its configuration and the work of one CUDA thread.
struct KernelLaunch {
  const void* kernel = nullptr;  ///< the kernel's address (its attributes; its name in messages)
  dim3 grid, block;
  size_t shared_bytes = 0;  ///< dynamic shared memory per block
  cudaStream_t stream = nullptr;
  std::function<void()> thread_body;      ///< calls the kernel with the launch's arguments
  std::vector<const void*> pointer_args;  ///< the arguments that are pointers, for the address check
};

/// Checks the configuration (a bad one is the error of the launch, for cudaGetLastError)
/// and queues the launch on its stream.
void submit(KernelLaunch launch);

template <class T>
void note_pointer(std::vector<const void*>& out, const T& v) {
  if constexpr (std::is_pointer_v<T> && !std::is_function_v<std::remove_pointer_t<T>>) out.push_back((const void*)v);
}

template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "a kernel launch passes one argument per parameter");
  static_assert((!std::is_reference_v<Params> && ...), "kernel parameters are passed by value");
  using Arguments = std::tuple<Params...>;
  static_assert(sizeof(Arguments) <= 32764, "a kernel's parameters are limited to 32764 bytes");
  auto arguments = std::make_shared<const Arguments>(std::forward<Args>(args)...);
  KernelLaunch l;
  l.kernel = reinterpret_cast<const void*>(kernel);
  l.grid = grid;
  l.block = block;
  l.shared_bytes = shared_bytes;
  l.stream = stream;
  std::apply([&](const auto&... a) { (note_pointer(l.pointer_args, a), ...); }, *arguments);
  l.thread_body = [kernel, arguments] { std::apply(kernel, *arguments); };
  submit(std::move(l));
}

}  // namespace ampgrad::emu
