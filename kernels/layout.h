// Strided layouts shared by every backend: the host-side description of N operands of one
// shape (operand 0 the output, inputs already broadcast) with the dims that are contiguous
// in every operand merged, innermost first. The CPU's loops walk it with pointers; CUDA
// passes it by value to a kernel, whose threads turn a linear index into byte offsets
// with offset_of (AG_HOST_DEVICE, so the CPU tests check the same arithmetic).
#pragma once

#include <array>
#include <cstdint>

#include "ampgrad/host_device.h"
#include "ampgrad/tensor.h"

namespace ampgrad::kernels {

inline constexpr int kMaxLoopDims = 16;

template <int N>
struct StridedLayout {
  int ndim = 0;
  int64_t sizes[kMaxLoopDims];
  int64_t strides[N][kMaxLoopDims];  // bytes; dim 0 is the innermost
  char* base[N];
  int64_t numel = 1;
};

/// A shape viewed as [outer, n, inner] around one dim (for kernels that work along a dim).
struct Split3 {
  int64_t outer = 1, n = 1, inner = 1;
  Split3(const Shape& s, int64_t dim) {
    for (int64_t d = 0; d < int64_t(s.size()); ++d) {
      if (d < dim) outer *= s[size_t(d)];
      else if (d == dim) n = s[size_t(d)];
      else inner *= s[size_t(d)];
    }
  }
};

/// Builds the coalesced layout of N operands over `sizes` (row-major, nd dims) with the
/// given byte strides per operand and base addresses. Dims are reversed so that dim 0 is
/// the innermost; size-1 dims are dropped and neighbours that are contiguous in every
/// operand merged. `op` names the caller in the error for too many dims.
template <int N>
StridedLayout<N> make_layout(const int64_t* sizes, int nd, const std::array<const int64_t*, N>& byte_strides,
                             const std::array<char*, N>& base, const char* op) {
  StridedLayout<N> L;
  AG_CHECK(nd <= kMaxLoopDims, op, "tensors of more than ", kMaxLoopDims, " dims are not supported, got ", nd);
  for (int k = 0; k < N; ++k) L.base[k] = base[size_t(k)];
  int d = 0;
  for (int i = nd - 1; i >= 0; --i) {
    if (sizes[i] == 1) continue;
    if (d > 0) {
      bool merge = true;
      for (int k = 0; k < N; ++k)
        if (L.strides[k][d - 1] * L.sizes[d - 1] != byte_strides[size_t(k)][i]) merge = false;
      if (merge) {
        L.sizes[d - 1] *= sizes[i];
        continue;
      }
    }
    L.sizes[d] = sizes[i];
    for (int k = 0; k < N; ++k) L.strides[k][d] = byte_strides[size_t(k)][i];
    ++d;
  }
  if (d == 0) {  // a single element
    L.sizes[0] = 1;
    for (int k = 0; k < N; ++k) L.strides[k][0] = 0;
    d = 1;
  }
  L.ndim = d;
  L.numel = 1;
  for (int i = 0; i < d; ++i) L.numel *= L.sizes[i];
  return L;
}

/// The layout of `ops`, which all have ops[0]'s shape (inputs already broadcast).
template <int N>
StridedLayout<N> make_layout(const std::array<const Tensor*, N>& ops) {
  const Shape& sizes = ops[0]->sizes();
  const int nd = int(sizes.size());
  AG_CHECK(nd <= kMaxLoopDims, "elementwise", "tensors of more than ", kMaxLoopDims,
           " dims are not supported, got ", nd);
  int64_t bytes[N][kMaxLoopDims];
  std::array<const int64_t*, N> strides;
  std::array<char*, N> base;
  for (int k = 0; k < N; ++k) {
    for (int i = 0; i < nd; ++i) bytes[k][i] = ops[k]->strides()[size_t(i)] * int64_t(ops[k]->itemsize());
    strides[size_t(k)] = bytes[k];
    base[size_t(k)] = static_cast<char*>(ops[k]->raw_data());
  }
  return make_layout<N>(sizes.data(), nd, strides, base, "elementwise");
}

/// The byte offset of operand k's element at linear index i (innermost dim fastest) of L.
template <int N>
AG_HOST_DEVICE inline int64_t offset_of(const StridedLayout<N>& L, int k, int64_t i) {
  int64_t off = 0;
  for (int d = 0; d < L.ndim; ++d) {
    const int64_t q = i / L.sizes[d];
    off += (i - q * L.sizes[d]) * L.strides[k][d];
    i = q;
  }
  return off;
}

/// True when operand k is laid out densely in L's order (element i at byte i * itemsize).
template <int N>
inline bool is_dense(const StridedLayout<N>& L, int k, int64_t itemsize) {
  return L.ndim == 1 && (L.strides[k][0] == itemsize || L.numel == 1);
}

}  // namespace ampgrad::kernels
