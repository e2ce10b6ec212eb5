// The Eigen GEMM that both CPU builds use, and the matmul geometry it shares with oneDNN's
// products (onednn_matmul.cpp); always compiled (the eigen_*.cpp files are the Eigen build's).
//
// - MatmulGeom reads a [B, M, K] x [B, K, N] problem off the tensors' strides: each matrix
//   is row-major or column-major with a leading dimension (so transposed views are used in
//   place), a batch stride of 0 is a broadcast operand, and a broadcast right operand whose
//   left operand stacks its batches row after row is folded into one [B*M, K] x [K, N].
// - eigen_matmul and eigen_linear are the Eigen implementation: GEMM on mapped strided
//   matrices. The Eigen build uses them for every dtype; the oneDNN build uses them for
//   float64, which oneDNN does not compute. float16/bfloat16 are widened to float32
//   buffers, computed, and narrowed once.
// - over_items is the threading rule of a batch of products, which the convolution's
//   im2col products (conv_common.cpp) follow too. tile_gemm's Eigen implementation is
//   declared in gemm.h.
#pragma once

#include <cstdint>

#include "ampgrad/tensor.h"
#include "cpu/parallel.h"

namespace ampgrad::cpu {

/// One matrix operand: element strides of its rows and columns (one of them is 1 unless
/// needs_copy) and of its batches (0 when broadcast or when there is one batch).
struct MatLayout {
  int64_t bs = 0, rs = 0, cs = 1;
  bool row_major() const { return cs == 1; }
  /// Leading dimension: the stride of the non-unit dim.
  int64_t ld() const { return cs == 1 ? rs : cs; }
};

struct MatmulGeom {
  int64_t B = 1, M = 0, K = 0, N = 0;
  MatLayout a, w;
};

/// t itself when its two matrix dims form a BLAS-style layout (one unit stride, the other
/// not overlapping), else a contiguous copy. Works on the last two dims of any rank.
Tensor gemm_operand(const Tensor& t);
/// The geometry of out = a @ w for a [B, M, K], w [B, K, N] (operands from gemm_operand)
/// and contiguous out [B, M, N].
MatmulGeom matmul_geom(const Tensor& a, const Tensor& w);
/// t [B, R, C] converted to dt, each batch contiguous in t's order (row-major, or
/// column-major where t is a transposed view, so the copy reads t in order); a broadcast
/// batch (stride 0) is converted once and stays broadcast. A gemm_operand as it is.
Tensor operand_copy(const Tensor& t, DType dt);

// ---- the Eigen implementation ----------------------------------------------------------
/// out [B, M, N] = a [B, M, K] @ w [B, K, N] (+ bias [N]), any operand strides.
void eigen_matmul(const Tensor& a, const Tensor& w, const Tensor& out, const Tensor& bias = Tensor());
void eigen_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out);

/// linear as one batched product: x [M, K] -> [1, M, K], weight [N, K] read transposed in
/// place as [1, K, N], out [M, N] -> [1, M, N]; views, no copies.
struct LinearAsMatmul {
  Tensor a, w, out;
  LinearAsMatmul(const Tensor& x, const Tensor& weight, const Tensor& out);
};

/// A contiguous float32 copy of t (t itself when undefined): the widened operand of a
/// float16/bfloat16 product.
Tensor float32_copy(const Tensor& t);

/// Whether a batch of `items` products of `flops_per_item` each runs its items in parallel,
/// each single-threaded, rather than in turn: enough of them to occupy the threads, or each
/// too small for Eigen to split well. Work too small to repay waking the threads (about a
/// megaflop in all) stays on the calling thread.
bool split_items(int64_t items, double flops_per_item);

/// body(i) for each item, split over the threads when split_items says so.
template <class Body>
void over_items(int64_t items, double flops_per_item, const Body& body) {
  if (split_items(items, flops_per_item)) {
    parallel_for(0, items, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) body(i);
    });
  } else {
    for (int64_t i = 0; i < items; ++i) body(i);
  }
}

}  // namespace ampgrad::cpu
