// Max pooling over an activation kept in a convolution's own layout (conv2d_block on the
// oneDNN build): the CNN block's ReLU, max pooling with max_pool2d's rules, and the
// gradient written back into that layout for the convolution's backward primitives.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ampgrad/dtype.h"

namespace ampgrad::cpu {

/// Where element (n, c, h, w) of the activation lives: n * sn + (c / cb) * sc + h * sh +
/// w * sw + c % cb (channels-last is one block of all C channels; NCHW has cb = 1). Blocks
/// past C are padding (oneDNN zeroes them).
struct BlockLayout {
  int64_t C = 0, cb = 1, blocks = 0, sn = 0, sc = 0, sh = 0, sw = 0;
};

/// One spatial dim of the pooling: kernel, stride, padding, dilation, input size.
struct PoolDim {
  int64_t k, s, p, d, in;
  int64_t start(int64_t o) const { return o * s - p; }
};

/// A window position meaning "no gradient" (the ReLU stops it, or no tap is inside).
constexpr uint8_t kNoGradient = 255;

/// out[n, c, oh, ow] (NCHW, float32 or bfloat16 as dtype) = relu (when relu) of the max of
/// y's window, with max_pool2d's rules: a NaN wins its window, padding never does, and the
/// first maximum in row-major order keeps the gradient. arg (out's shape) receives that
/// tap's position in the window (kh * kw_size + kw), or kNoGradient where the output is
/// not > 0 under the ReLU. Windows must not overlap and have fewer than 255 taps.
void block_pool_forward(DType dtype, const void* y, const BlockLayout& L, const PoolDim& ph, const PoolDim& pw,
                        int64_t N, int64_t OH, int64_t OW, bool relu, void* out, uint8_t* arg);

/// gy (the activation's gradient in y's layout, gy_bytes long, padding included) = g
/// (NCHW) at each window's arg position, 0 elsewhere.
void block_pool_backward(DType dtype, const void* g, const uint8_t* arg, const BlockLayout& L, const PoolDim& ph,
                         const PoolDim& pw, int64_t N, int64_t OH, int64_t OW, void* gy, size_t gy_bytes);

}  // namespace ampgrad::cpu
