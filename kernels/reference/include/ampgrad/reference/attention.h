// Scaled dot-product attention, forward and backward, in float64: the specification that
// the fast kernels (kernels/cpu/attention.cpp's tiled FlashAttention-2, and the CUDA
// backend's composed form) implement. Plain loops over the full [Tq, Tk] score matrix, no
// dependency on the library: read it alone.
//
// Layout, row-major, with B the product of all batch dims (heads included):
//   q [B, Tq, D], k [B, Tk, D], v [B, Tk, Dv], out and dout [B, Tq, Dv].
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ampgrad::reference {

struct AttentionShape {
  int64_t B, Tq, Tk, D, Dv;
};

struct AttentionOptions {
  /// The factor of q k^T (the library's default is 1 / sqrt(D)).
  double scale = 1;
  /// Query i sees key j only when j <= i.
  bool causal = false;
  /// Empty, or [B, Tq, Tk] values added to the scores (0 keeps a key, -inf hides it; a
  /// boolean mask is 0 where true and -inf where false).
  std::span<const double> mask = {};
  /// Empty, or [B, Tq, Tk] factors multiplying the probabilities after the softmax: 0 for
  /// a dropped one, 1 / (1 - p) for a kept one (dropout with probability p).
  std::span<const double> dropout = {};
};

/// out = dropout(softmax(scale q k^T + mask)) v per batch entry; a query that sees no key
/// (every score -inf) gives a row of zeros.
std::vector<double> attention(std::span<const double> q, std::span<const double> k, std::span<const double> v,
                              const AttentionShape& sh, const AttentionOptions& o);

/// The gradients of attention for the incoming gradient dout: dq [B, Tq, D],
/// dk [B, Tk, D], dv [B, Tk, Dv] (zero contributions from a query that sees no key).
struct AttentionGrads {
  std::vector<double> dq, dk, dv;
};
AttentionGrads attention_backward(std::span<const double> q, std::span<const double> k, std::span<const double> v,
                                  std::span<const double> dout, const AttentionShape& sh, const AttentionOptions& o);

}  // namespace ampgrad::reference
