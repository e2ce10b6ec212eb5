// The internal precision of float32 matrix products and convolutions (as in PyTorch's
// torch.set_float32_matmul_precision).
//
// "highest" (the default) computes float32 products in full float32. "high" and "medium"
// let the hardware use faster reduced-precision arithmetic for float32 operands; the
// result stays float32:
// - CUDA: both allow TF32 tensor cores in cuBLASLt (CUBLAS_COMPUTE_32F_FAST_TF32) and
//   cuDNN (CUDNN_DEFAULT_MATH instead of CUDNN_FMA_MATH).
// - CPU, oneDNN build: "medium" rounds the operands of float32 matmul and linear (forward
//   and backward) to bfloat16 and accumulates in float32, where the CPU runs bfloat16
//   natively (AVX512-BF16 or AMX-BF16; hw::verdict); bias, post-ops, convolutions and
//   attention stay float32, as in PyTorch's CPU backend. "high" changes nothing there (these
//   CPUs have no TF32 arithmetic), nor does either value on other CPUs or in the Eigen-only
//   build.
// Products of other dtypes ignore the setting. It is process-wide and read at each call.
#pragma once

#include <string>

namespace ampgrad {

/// Sets the float32 product precision: "highest", "high" or "medium"; any other string
/// throws ag::Error naming the function and the value.
void set_float32_matmul_precision(const std::string& precision);
/// The current setting: "highest", "high" or "medium".
std::string get_float32_matmul_precision();

/// The setting as backends read it.
enum class Float32MatmulPrecision { Highest, High, Medium };
Float32MatmulPrecision float32_matmul_precision();
/// "highest", "high" or "medium".
const char* float32_matmul_precision_name(Float32MatmulPrecision p);

}  // namespace ampgrad
