// CUDA paths that the cross-backend harness (test_backend_ops.cpp) cannot reach by
// comparing one op with the CPU backend: float32 products under TF32 (the CPU backend has
// no TF32 arithmetic, so the reference is float64 loops over TF32-rounded inputs), and a
// tensor of more than 2^31 elements, where 32-bit index arithmetic would wrap (checked at
// known positions rather than against a CPU copy, to stay cheap). Without a CUDA device
// each test skips saying so.
#include <cstring>
#include <limits>

#include "support/testing.h"

namespace {

using namespace ag;

const Device kGpu(kCUDA, 0);
bool have_cuda() { return !hw::query().cuda.empty(); }

#define AGT_NEED_CUDA()                                               \
  if (!built_with_cuda()) AGT_SKIP_BUILD() << "built without CUDA"; \
  if (!have_cuda()) AGT_SKIP_HARDWARE() << "no CUDA device"

// ---- TF32 -----------------------------------------------------------------------------------

// float32 values in [-2, 2) none of which is a TF32 tie (the 13 bits TF32 drops never read
// exactly half its last place), so that the reference does not depend on how ties round.
Tensor no_tie_values(std::vector<int64_t> shape) {
  std::vector<float> v = agt::rand64(shape, -2, 2, false).to(kFloat32).to_vector<float>();
  for (float& f : v) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x1FFFu) == 0x1000u) bits ^= 1u;
    std::memcpy(&f, &bits, sizeof bits);
  }
  return from_vector<float>(v, shape);
}

// a [M, K] @ w [K, N] in float64 loops, each input first mapped by `round`.
Tensor ref_product(const Tensor& a, const Tensor& w, double (*round)(double)) {
  const int64_t M = a.size(0), K = a.size(1), N = w.size(1);
  const std::vector<double> av = a.to(kFloat64).to_vector<double>(), wv = w.to(kFloat64).to_vector<double>();
  std::vector<double> out(size_t(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) out[size_t(m * N + n)] += round(av[size_t(m * K + k)]) * round(wv[size_t(k * N + n)]);
  return from_vector<double>(out, {M, N});
}
double exact(double x) { return x; }

// "high" (as "medium") lets CUDA compute float32 products with TF32 tensor cores: both
// operands rounded to 11 significant bits, float32 sums. "highest" rounds nothing. The two references differ
// by far more than float32's tolerance, so each result matches one of them only.
TEST(CudaBackendOps, Float32ProductsRoundToTf32UnderHighButNotHighest) {
  AGT_NEED_CUDA();
  agt::Float32MatmulPrecisionGuard restore;
  const int64_t M = 33, K = 70, N = 20;
  const Tensor a = no_tie_values({M, K}), w = no_tie_values({K, N}), wt = no_tie_values({N, K});
  const Tensor ref_tf32 = ref_product(a, w, agt::tf32), ref_full = ref_product(a, w, exact);
  // linear reads its weight transposed in place (the other transpose flag)
  const Tensor lin_tf32 = ref_product(a, wt.t(), agt::tf32), lin_full = ref_product(a, wt.t(), exact);
  const agt::Tol tol = agt::fp32_tol(K);
  for (const char* precision : {"high", "highest"}) {
    SCOPED_TRACE(precision);
    set_float32_matmul_precision(precision);
    const bool rounds = std::string(precision) == "high";
    const Tensor got = matmul(a.to(kGpu), w.to(kGpu)).to(kCPU);
    const Tensor lin = linear(a.to(kGpu), wt.to(kGpu)).to(kCPU);
    EXPECT_TRUE(agt::allclose(got, rounds ? ref_tf32 : ref_full, tol));
    EXPECT_FALSE(agt::allclose(got, rounds ? ref_full : ref_tf32, tol)) << "the rounding does not show";
    EXPECT_TRUE(agt::allclose(lin, rounds ? lin_tf32 : lin_full, tol));
    EXPECT_FALSE(agt::allclose(lin, rounds ? lin_full : lin_tf32, tol));
    // 1 + 2^-12 lies between two TF32 values and is nearer 1 (no tie): K products of it
    // with 1 sum to K under TF32, to K (1 + 2^-12) in float32 (both exact in float32).
    const Tensor x = full({1, K}, 1.0 + 0x1p-12, TensorOptions(kFloat32).device(kGpu));
    const Tensor one = ones({K, 1}, TensorOptions(kFloat32).device(kGpu));
    EXPECT_EQ(matmul(x, one).item<float>(), rounds ? float(K) : float(K * (1.0 + 0x1p-12)));
    EXPECT_EQ(matmul(one.t(), x.t()).item<float>(), rounds ? float(K) : float(K * (1.0 + 0x1p-12)));
  }
}

// ---- past 2^31 elements -------------------------------------------------------------------

// A uint8 tensor of 2^31 + 4098 elements (2 GiB of emulated device memory, which is host
// memory): the dense fill's vector index, a full sum's reduced range (split into chunks
// and merged) and index_select's source offsets go past what 32 bits hold; a strided fill
// writes the far end of each half. Values are read back at known positions, not compared
// with a CPU copy.
TEST(CudaBackendOps, TensorPastTwoToThe31ElementsIndexesIn64Bits) {
  AGT_NEED_CUDA();
  const int64_t N = (int64_t(1) << 31) + 4098;  // even, and not a multiple of the 16-byte vector
  Tensor x;
  try {
    x = empty({N}, TensorOptions(kUInt8).device(kGpu));
  } catch (const Error& e) {
    AGT_SKIP_HARDWARE() << "cannot allocate " << N << " bytes of device memory: " << e.what();
  }
  auto read = [&](int64_t start, int64_t n) {
    std::vector<int64_t> v;
    for (uint8_t b : x.narrow(0, start, n).to(kCPU).to_vector<uint8_t>()) v.push_back(b);
    return v;
  };
  x.fill_(1);
  EXPECT_EQ(read(N - 4, 4), std::vector<int64_t>({1, 1, 1, 1}));
  EXPECT_EQ(read((int64_t(1) << 31) - 2, 4), std::vector<int64_t>({1, 1, 1, 1}));
  x.narrow(0, N - 1, 1).fill_(7);
  x.narrow(0, int64_t(1) << 31, 1).fill_(5);
  EXPECT_EQ(sum(x).item<int64_t>(), N + 6 + 4);
  // [2, 2] with strides (N / 2, 1): the last two elements of each half
  x.view({2, N / 2}).narrow(1, N / 2 - 2, 2).fill_(9);
  EXPECT_EQ(read(N / 2 - 3, 3), std::vector<int64_t>({1, 9, 9}));
  EXPECT_EQ(read(N - 3, 3), std::vector<int64_t>({1, 9, 9}));
  const Tensor idx = from_vector<int64_t>({0, (int64_t(1) << 31) - 1, int64_t(1) << 31, N - 3, N - 1}, {5}).to(kGpu);
  std::vector<int64_t> picked;
  for (uint8_t b : x.index_select(0, idx).to(kCPU).to_vector<uint8_t>()) picked.push_back(b);
  EXPECT_EQ(picked, std::vector<int64_t>({1, 1, 5, 1, 9}));
}

}  // namespace
