// Matrix products through oneDNN matmul primitives (the AMPGRAD_ONEDNN=ON build).
//
// Operands are described to oneDNN with their own strides, so transposed views (the
// backward's a^T and b^T, linear's weight^T) are read in place; a broadcast batch (stride
// 0) becomes a batch dim of 1, which oneDNN broadcasts. float32 and bfloat16 run natively
// with float32 accumulation; linear passes its bias to the primitive (fused), and
// linear_act its activation as an eltwise post-op (ReLU always; GELU when the
// pre-activation need not be kept, since a post-op writes only the activated result).
// Large float32 products take the weight in oneDNN's blocked layout (kBlockedRows).
// Primitives are cached per problem (onednn_cache.h).
//
// ag::set_float32_matmul_precision("medium") lets float32 products compute in bfloat16 on
// CPUs with native bfloat16 (AVX512-BF16 or AMX-BF16), as PyTorch's CPU backend does: the
// operands are rounded to bfloat16 copies (oneDNN 2.6's matmul ignores the bf16 fpmath
// mode, so the copies are ours) and multiplied with float32 accumulation into the float32
// result, bias and post-ops in float32. Elsewhere, and under "high" (no TF32 or
// bfloat16x3 arithmetic on these CPUs), float32 products stay float32.
//
// Fallbacks: float64 goes to the Eigen GEMM (oneDNN has no f64 matmul). A oneDNN float16
// matmul needs AVX512-FP16 (or AMX-FP16); where the primitive cannot be created (CPUs
// without it, such as AVX-512 EPYCs) or only the reference kernel exists, which is found
// out once per shape, the operands are converted to float32, multiplied, and the result
// is rounded once to float16.
#include "ampgrad/hw/profile.h"
#include "ampgrad/matmul_precision.h"
#include "ampgrad/raw.h"
#include "cpu/cpu_backend.h"
#include "cpu/gemm.h"
#include "cpu/gemm_common.h"
#include "cpu/onednn_cache.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <memory>

namespace ampgrad::cpu {
namespace {

using namespace onednn;

Cache<PrimitivePlan>& matmul_cache() {
  static auto* c = new Cache<PrimitivePlan>();
  return *c;
}

// Memory descriptor of one [B, R, C] operand; a broadcast batch has dim 1.
memory::desc operand_md(bool batched, int64_t B, int64_t R, int64_t C, const MatLayout& L, dt t) {
  if (!batched) return memory::desc({R, C}, t, {L.rs, L.cs});
  const int64_t extent = (R - 1) * L.rs + (C - 1) * L.cs + 1;
  return L.bs == 0 ? memory::desc({1, R, C}, t, {extent, L.rs, L.cs})
                   : memory::desc({B, R, C}, t, {L.bs, L.rs, L.cs});
}

dnnl::algorithm post_op_algorithm(Activation act) {
  switch (act) {
    case Activation::Relu: return dnnl::algorithm::eltwise_relu;
    case Activation::GeluErf: return dnnl::algorithm::eltwise_gelu_erf;
    case Activation::GeluTanh: return dnnl::algorithm::eltwise_gelu_tanh;
    case Activation::None: break;
  }
  AG_ERROR(op::linear, "no oneDNN post-op for the activation ", activation_name(act));
}

// True when float32 products compute in bfloat16 now: "medium" on a CPU that runs bfloat16
// natively (hw::float32_products, which ampgrad-info prints).
bool float32_in_bf16() {
  static const bool medium_bf16 =
      hw::float32_products(hw::query(), Device(kCPU), Float32MatmulPrecision::Medium).math == hw::Float32Math::BFloat16;
  return medium_bf16 && float32_matmul_precision() == Float32MatmulPrecision::Medium;
}

// Float32 products of at least kBlockedRows rows whose weight holds at least kBlockedWeight
// elements take the weight in oneDNN's own blocked layout, reordered on each call (the
// weight changes every step, so there is nothing to keep). The reorder pays for itself only
// where the product is long and the weight large; smaller products, and bfloat16 ones, keep
// the plain layout (the measurements: docs/performance-history.md).
constexpr int64_t kBlockedRows = 2048, kBlockedWeight = 1 << 16;

bool blocked_weights(const MatmulGeom& g, DType t, DType td) {
  return t == kFloat32 && td == kFloat32 && g.B == 1 && g.M >= kBlockedRows && g.K * g.N >= kBlockedWeight;
}

// t: the operands' (and bias's) type; td: the result's (t, or f32 for 16-bit operands);
// tb: the bias's type (t, or f32 under "medium"); act: an activation applied as a post-op
// (None: none); mul: the result multiplied by a tensor of its own shape and type (a binary
// post-op, after act); blocked: the weight in the layout oneDNN picks.
std::shared_ptr<PrimitivePlan> make_matmul(const MatmulGeom& g, dt t, dt td, bool bias, dt tb, Activation act, bool mul,
                                  bool blocked) {
  const bool batched = g.B > 1;
  const memory::desc a = operand_md(batched, g.B, g.M, g.K, g.a, t);
  const memory::desc w = operand_md(batched, g.B, g.K, g.N, g.w, t);
  const memory::desc d = batched ? memory::desc({g.B, g.M, g.N}, td, {g.M * g.N, g.N, 1})
                                 : memory::desc({g.M, g.N}, td, {g.N, 1});
  const memory::desc b = batched ? memory::desc({1, 1, g.N}, tb, {g.N, g.N, 1})
                                 : memory::desc({1, g.N}, tb, {g.N, 1});
  const memory::desc wp = blocked ? memory::desc(w.dims(), t, memory::format_tag::any) : w;
  try {
    const dnnl::matmul::desc desc = bias ? dnnl::matmul::desc(a, wp, b, d) : dnnl::matmul::desc(a, wp, d);
    dnnl::primitive_attr attr;
    dnnl::post_ops po;
    if (act != Activation::None) po.append_eltwise(1.f, post_op_algorithm(act), 0.f, 0.f);
    if (mul) po.append_binary(dnnl::algorithm::binary_mul, d);
    if (act != Activation::None || mul) attr.set_post_ops(po);
    const dnnl::matmul::primitive_desc pd(desc, attr, engine());
    std::vector<ArgSpec> args{{DNNL_ARG_SRC, a, a, false}, {DNNL_ARG_WEIGHTS, w, pd.weights_desc(), false}};
    if (bias) args.push_back({DNNL_ARG_BIAS, b, b, false});
    args.push_back({DNNL_ARG_DST, d, d, true});
    if (mul) args.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(act != Activation::None ? 1 : 0) | DNNL_ARG_SRC_1, d, d, false});
    return make_plan<dnnl::matmul>(pd, args);
  } catch (const dnnl::error& e) {
    if (e.status == dnnl_unimplemented) return std::make_shared<PrimitivePlan>();
    throw;
  }
}

void run(const Tensor& a0, const Tensor& w0, const Tensor& bias, const Tensor& out, const char* op,
         Activation act = Activation::None, const Tensor* mul = nullptr);

// The same product on float32 copies, rounded once into out (written directly when float32).
void run_in_float(const Tensor& a, const Tensor& w, const Tensor& bias, const Tensor& out, const char* op,
                  Activation act) {
  const bool direct = out.dtype() == kFloat32;
  Tensor of = direct ? out : make_tensor(out.sizes(), kFloat32, out.device());
  Tensor bf;
  if (bias.defined()) {
    bf = make_tensor(bias.sizes(), kFloat32, bias.device());
    cpu_backend().copy(bias, bf);
  }
  run(operand_copy(a, kFloat32), operand_copy(w, kFloat32), bf, of, op, act);
  if (!direct) cpu_backend().copy(of, out);
}

// eigen_matmul, then the activation in place.
void eigen_with(const Tensor& a, const Tensor& w, const Tensor& bias, const Tensor& out, Activation act) {
  eigen_matmul(a, w, out, bias);
  if (act != Activation::None) cpu_backend().unary(activation_op(act), out, out, {});
}

// dY^T X through sgemm, split along the inner dimension (the batch's rows) into shares of
// at least kShareRows rows, each multiplied on one thread, and the partial products summed
// as a binary tree over the shares in order. sgemm's own threading splits the result
// instead, so that every thread reads every row, most of them written by the other
// thread's share of the op before (in the other core's cache), where a share's rows are
// still in the cache of the thread that wrote them. With more threads than
// shares, each share's result rows are split among them (blocks of at least 16 rows). The
// shares depend on the shape alone, and sgemm computes an element alike whichever rows it
// is given, so the result has the same bits for any thread count (tested). The partial
// products' scratch is kept under half the operands' size.
constexpr int64_t kShareRows = 1024, kMaxShares = 8;

bool weight_grad_sgemm(const MatmulGeom& g, const float* a, const float* w, float* c) {
  const char tb = g.w.row_major() ? 'N' : 'T';
  const int64_t S = std::min({kMaxShares, g.K / kShareRows, 1 + g.K * (g.M + g.N) / (2 * g.M * g.N)});
  if (S <= 1) return dnnl_sgemm('T', tb, g.M, g.N, g.K, 1.0f, a, g.a.ld(), w, g.w.ld(), 0.0f, c, g.N) == dnnl_success;
  const int64_t MN = g.M * g.N;
  const std::unique_ptr<float[]> scratch(new float[size_t(S - 1) * size_t(MN)]);  // written before read
  auto part = [&](int64_t s) { return s == 0 ? c : scratch.get() + size_t(s - 1) * size_t(MN); };
  std::atomic<bool> ok{true};
  const int threads = omp_in_parallel() ? 1 : int(std::min<int64_t>(omp_get_max_threads(), S * g.M));
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
    // G blocks of result rows per share, of at least 16 rows (sgemm takes another path, its
    // own order of sums, for a single row)
    const int64_t G = std::max<int64_t>(1, std::min<int64_t>(n / S, g.M / 16)), items = S * G;
    for (int64_t item = items * t / n; item < items * (t + 1) / n; ++item) {  // share-major: adjacent rows
      const int64_t s = item / G, j = item % G;
      const int64_t k0 = g.K * s / S, k1 = g.K * (s + 1) / S, m0 = g.M * j / G, m1 = g.M * (j + 1) / G;
      const float* wk = w + (tb == 'N' ? k0 * g.w.ld() : k0);
      if (m1 > m0 && dnnl_sgemm('T', tb, m1 - m0, g.N, k1 - k0, 1.0f, a + k0 * g.a.ld() + m0, g.a.ld(), wk,
                                g.w.ld(), 0.0f, part(s) + m0 * g.N, g.N) != dnnl_success)
        ok = false;
    }
    for (int64_t step = 1; step < S; step *= 2) {  // part(s) += part(s + step), every 2 step-th s
#pragma omp barrier
      const int64_t e0 = MN * t / n, e1 = MN * (t + 1) / n;
      for (int64_t s = 0; s + step < S; s += 2 * step) {
        float* dst = part(s);
        const float* src = part(s + step);
        for (int64_t i = e0; i < e1; ++i) dst[i] += src[i];
      }
    }
  }
  return ok || dnnl_sgemm('T', tb, g.M, g.N, g.K, 1.0f, a, g.a.ld(), w, g.w.ld(), 0.0f, c, g.N) == dnnl_success;
}

// out [B, M, N] = act(a [B, M, K] @ w [B, K, N] (+ bias [N])), times *mul (contiguous, out's
// shape and dtype) when given.
void run(const Tensor& a0, const Tensor& w0, const Tensor& bias0, const Tensor& out, const char* op, Activation act,
         const Tensor* mul) {
  if (out.numel() == 0) return;
  if (mul && (a0.dtype() == kFloat64 || a0.size(-1) == 0)) {
    // paths without the post-op: the product, then the multiplication
    run(a0, w0, bias0, out, op, act, nullptr);
    return cpu_backend().binary(BinaryOp::Mul, out, *mul, out);
  }
  const DType dtype = a0.dtype();
  if (dtype == kFloat64) return eigen_with(a0, w0, bias0, out, act);
  const Tensor a = gemm_operand(a0), w = gemm_operand(w0);
  const Tensor bias = bias0.defined() ? detail::contiguous_raw(bias0) : bias0;
  const MatmulGeom g = matmul_geom(a, w);
  if (g.B > 1 && g.a.bs == 0 && g.w.bs == 0) {
    // Both operands broadcast over the batch (oneDNN takes a batch of 1 in the operands only
    // with the result's batch as large): every batch is the same product, made once, copied.
    auto first = [](const Tensor& t) {
      return detail::make_view(t, {1, t.size(1), t.size(2)}, t.strides(), t.storage_offset());
    };
    const Tensor o1 = first(out);
    run(first(a), first(w), bias, o1, op, act, nullptr);
    const Shape rest{out.size(0) - 1, out.size(1), out.size(2)};
    cpu_backend().copy(detail::make_view(o1, rest, {0, out.stride(1), out.stride(2)}, o1.storage_offset()),
                       detail::make_view(out, rest, out.strides(), out.storage_offset() + out.stride(0)));
    if (mul) cpu_backend().binary(BinaryOp::Mul, out, *mul, out);
    return;
  }
  if (g.K == 0) {  // an empty sum: zeros, plus the bias
    if (bias.defined()) cpu_backend().copy(detail::expand_raw(bias, out.sizes()), out);
    else cpu_backend().fill(out, 0);
    if (act != Activation::None) cpu_backend().unary(activation_op(act), out, out, {});
    return;
  }
  if (dtype == kFloat32 && float32_in_bf16())  // "medium"
    return run(operand_copy(a, kBFloat16), operand_copy(w, kBFloat16), bias, out, op, act, mul);
  // A weight gradient's product, dY^T X: a transposed and a long inner dimension (the
  // batch's rows). oneDNN's sgemm reads a transposed a as part of its packing, where the
  // matmul primitive first copies it (bench_matmul's weight_grad rows compare the two).
  if (dtype == kFloat32 && out.dtype() == kFloat32 && g.B == 1 && !bias.defined() && act == Activation::None &&
      !mul && !g.a.row_major() && g.K >= 512 &&
      weight_grad_sgemm(g, static_cast<const float*>(a.raw_data()), static_cast<const float*>(w.raw_data()),
                        static_cast<float*>(out.raw_data())))
    return;
  Key key;
  key << 1 << int64_t(dtype) << int64_t(out.dtype()) << g.B << g.M << g.K << g.N << g.a.bs << g.a.rs << g.a.cs << g.w.bs
      << g.w.rs << g.w.cs << bias.defined() << int64_t(act) << (mul != nullptr)
      << (bias.defined() ? int64_t(bias.dtype()) : -1);
  std::shared_ptr<PrimitivePlan> plan = guarded(
      op,
      [&] {
        return matmul_cache().get(key, [&] {
          return make_matmul(g, dnnl_type(dtype), dnnl_type(out.dtype()), bias.defined(),
                             bias.defined() ? dnnl_type(bias.dtype()) : dt::f32, act, mul != nullptr,
                             blocked_weights(g, dtype, out.dtype()));
        });
      },
      [&] {
        return std::string(dtype_name(dtype)) + " [" + std::to_string(g.B) + ", " + std::to_string(g.M) + ", " +
               std::to_string(g.K) + "] @ [" + std::to_string(g.B) + ", " + std::to_string(g.K) + ", " +
               std::to_string(g.N) + "] -> " + dtype_name(out.dtype()) + (bias.defined() ? " with a bias" : "") +
               (act != Activation::None ? std::string(" and ") + activation_name(act) : "");
      });
  if (!plan->ok()) {
    if (mul) {
      run(a, w, bias, out, op, act, nullptr);
      return cpu_backend().binary(BinaryOp::Mul, out, *mul, out);
    }
    if (is_reduced_floating(dtype)) return run_in_float(a, w, bias, out, op, act);
    return eigen_with(a, w, bias, out, act);  // float32 that oneDNN only has a reference kernel for
  }
  if (bias.defined() && mul)
    plan->execute({a.raw_data(), w.raw_data(), bias.raw_data(), out.raw_data(), mul->raw_data()}, op);
  else if (bias.defined())
    plan->execute({a.raw_data(), w.raw_data(), bias.raw_data(), out.raw_data()}, op);
  else if (mul)
    plan->execute({a.raw_data(), w.raw_data(), out.raw_data(), mul->raw_data()}, op);
  else
    plan->execute({a.raw_data(), w.raw_data(), out.raw_data()}, op);
}

}  // namespace

void CpuBackend::matmul(const Tensor& a, const Tensor& w, const Tensor& out) { run(a, w, Tensor(), out, op::matmul); }

void CpuBackend::linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  const LinearAsMatmul v(x, weight, out);
  run(v.a, v.w, bias, v.out, op::linear);
}

void CpuBackend::matmul_times(const Tensor& a, const Tensor& w, const Tensor& mul, const Tensor& out) {
  run(a, w, Tensor(), out, op::matmul, Activation::None, &mul);
}

Tensor CpuBackend::linear_act(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                              const Tensor& out, bool keep) {
  if (keep && !activation_grad_reads_output(act)) return linear_act_with_slope(x, weight, bias, act, out);
  const LinearAsMatmul v(x, weight, out);
  run(v.a, v.w, bias, v.out, op::linear, act);
  return Tensor();
}

// oneDNN's sgemm runs on one thread inside a parallel region. It fails only on arguments
// that tile_gemm's contract excludes; should it ever refuse, Eigen computes the same product
// (a kernel's parallel region cannot throw).
void tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0 || small_tile_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
  if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) != dnnl_success)
    eigen_tile_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace ampgrad::cpu

namespace ampgrad::detail {
size_t cpu_primitive_cache_size() { return cpu::onednn::g_cached_primitives.load(); }
}  // namespace ampgrad::detail
