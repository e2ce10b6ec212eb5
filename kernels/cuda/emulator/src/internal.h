// What the emulator's runtime (runtime.cpp) and execution engine (exec.cpp) share.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "emu/control.h"
#include "emu/launch.h"

namespace ampgrad::emu::detail {

/// An error inside a kernel: a launch ends with it (a sticky error).
struct Fault {
  cudaError_t error = cudaSuccess;
  std::string message;
};

/// Runs every block of the launch and returns when all have finished, or when a fault has
/// stopped the grid (the blocks running then end at their next barrier or collective).
Fault run_grid(const KernelLaunch& launch);

/// The kernel's name for messages (symbols.cpp): its symbol, demangled, from the dynamic or
/// the full symbol table of the object that holds it; else its address.
std::string kernel_name(const void* kernel);

/// Fills n bytes at p with the poison pattern (kPoison16 at every even address).
void poison(void* p, size_t n);

/// Reads an environment variable as an integer (fallback when unset or malformed).
long env_long(const char* name, long fallback);

}  // namespace ampgrad::emu::detail
