// Matrix products: matmul (torch.matmul semantics) and linear, forward and backward side
// by side.
//
// Every product reaches the backend as [B, M, K] @ [B, K, N] views of the operands' own
// memory: batch dims are broadcast with stride 0 and collapsed into B when their strides
// allow (otherwise that operand is copied once), and transposed operands keep their
// strides, so the backward's g @ b^T and a^T @ g copy nothing. An N-D left operand with a
// 2-D right one is folded into one [rows, K] @ [K, N] product (as PyTorch does), which
// also makes the right operand's gradient one GEMM instead of a batch of them and a sum.
// Operands must share one floating dtype (no implicit promotion, as in PyTorch); gradients
// of broadcast batch dims are summed by the engine.
#include "ampgrad/dispatch.h"
#include "ampgrad/factories.h"
#include "ampgrad/ops/elementwise.h"
#include "ampgrad/ops/nn.h"
#include "ampgrad/ops/reduce.h"
#include "ampgrad/ops/shape.h"
#include "internal.h"

namespace ampgrad {

namespace {

void check_operands(const Tensor& a, const Tensor& b) {
  detail::check_defined(a, "matmul", "the first operand");
  detail::check_defined(b, "matmul", "the second operand");
  detail::check_same_device(a, b, "matmul");
  AG_CHECK(a.dtype() == b.dtype(), "matmul", "expected both operands to have one dtype, got ",
           dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
  AG_CHECK(a.is_floating_point(), "matmul", "expected floating operands, got ", dtype_name(a.dtype()));
  AG_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul", "both operands need at least 1 dim, got shapes ",
           a.sizes(), " and ", b.sizes());
}

// The product of all dims but the last (explicit, since reshape cannot infer -1 when K = 0).
int64_t leading_rows(const Tensor& t) {
  int64_t n = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) n *= t.size(d);
  return n;
}

Shape batch_dims(const Tensor& t) { return Shape(t.sizes().data(), size_t(t.dim() - 2)); }

// t [..., R, C] broadcast to batch + [R, C] and seen as [B, R, C]: a view when the batch
// dims collapse into one stride (broadcast dims all have stride 0), else a copy.
Tensor as_batch3(const Tensor& t, const Shape& batch, int64_t B) {
  const int64_t R = t.size(-2), C = t.size(-1);
  Shape full = batch;
  full.push_back(R);
  full.push_back(C);
  Tensor e = detail::expand_raw(t, full);
  // Walking out from the innermost batch dim, each dim of size > 1 must have the stride
  // of the one inside it times that one's size.
  int64_t inner = 0, expect = -1;
  bool ok = true;
  for (int64_t d = int64_t(batch.size()) - 1; d >= 0 && ok; --d) {
    const int64_t size = batch[size_t(d)], stride = e.stride(d);
    if (size == 1) continue;
    if (expect < 0) inner = stride;
    else ok = stride == expect;
    expect = stride * size;
  }
  if (!ok) {
    e = detail::contiguous_raw(e);
    inner = R * C;
  }
  return detail::make_view(e, {B, R, C}, {B > 1 ? inner : 0, e.stride(-2), e.stride(-1)},
                           e.storage_offset());
}

// a [..., M, K] @ b [..., K, N], both of rank >= 2: one backend call, one node. The result
// has the operands' dtype, or float32 (out_dtype) for 16-bit operands: backward formulas
// use that for gradients that gradient_dtype allows to stay float32.
Tensor matmul_nd(const Tensor& a, const Tensor& b, DType out_dtype) {
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  AG_CHECK(b.size(-2) == K, "matmul", "cannot multiply shapes ", a.sizes(), " and ", b.sizes(), ": ",
           K, " != ", b.size(-2));
  Tensor out;
  if (a.dim() == 2 && b.dim() == 2) {  // the hot path: no broadcasting to work out
    out = make_tensor({M, N}, out_dtype, a.device());
    backend(a.device(), "matmul")
        .matmul(detail::make_view(a, {1, M, K}, {0, a.stride(0), a.stride(1)}, a.storage_offset()),
                detail::make_view(b, {1, K, N}, {0, b.stride(0), b.stride(1)}, b.storage_offset()),
                detail::make_view(out, {1, M, N}, {M * N, N, 1}, 0));
  } else {
    const Shape batch = broadcast_shapes(batch_dims(a), batch_dims(b), "matmul");
    const int64_t B = batch.numel();
    Shape shape = batch;
    shape.push_back(M);
    shape.push_back(N);
    out = make_tensor(shape, out_dtype, a.device());
    backend(a.device(), "matmul")
        .matmul(as_batch3(a, batch, B), as_batch3(b, batch, B),
                detail::make_view(out, {B, M, N}, {M * N, N, 1}, 0));
  }
  if (any_requires_grad({&a, &b}))
    record("matmul", {a, b}, {out},
           [sa = detail::save_if(a, b.requires_grad()), sb = detail::save_if(b, a.requires_grad()),
            da = gradient_dtype(a), db = gradient_dtype(b)](const TensorList& g, GradMask need) -> TensorList {
             Tensor ga, gb;
             if (need[0]) ga = matmul_nd(g[0], transpose(sb.get(), -1, -2), da);
             if (need[1]) gb = matmul_nd(transpose(sa.get(), -1, -2), g[0], db);
             return {ga, gb};
           });
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (auto in = dispatch::autocast("matmul", a, b)) return matmul((*in)[0], (*in)[1]);
  check_operands(a, b);
  const int64_t ka = a.size(-1), kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  AG_CHECK(ka == kb, "matmul", "cannot multiply shapes ", a.sizes(), " and ", b.sizes(), ": ", ka,
           " != ", kb);
  if (a.dim() >= 2 && b.dim() >= 2) {
    if (b.dim() == 2 && a.dim() > 2) {  // fold the batch into rows
      std::vector<int64_t> shape = a.sizes().vec();
      shape.back() = b.size(1);
      return reshape(matmul_nd(reshape(a, {leading_rows(a), ka}), b, a.dtype()), shape);
    }
    return matmul_nd(a, b, a.dtype());
  }
  if (a.dim() == 1 && b.dim() == 1) return reshape(matmul_nd(view(a, {1, ka}), view(b, {ka, 1}), a.dtype()), {});
  if (a.dim() == 1) return squeeze(matmul(unsqueeze(a, 0), b), -2);
  return squeeze(matmul(a, unsqueeze(b, 1)), -1);
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (auto in = dispatch::autocast("linear", x, weight, bias)) return linear((*in)[0], (*in)[1], (*in)[2]);
  detail::check_defined(x, "linear", "input");
  detail::check_defined(weight, "linear", "weight");
  detail::check_same_device(x, weight, "linear");
  AG_CHECK(weight.dim() == 2, "linear", "weight must be 2-D [out_features, in_features], got shape ",
           weight.sizes());
  AG_CHECK(x.dim() >= 1, "linear", "input must have at least 1 dim, got shape ", x.sizes());
  const int64_t K = weight.size(1), N = weight.size(0);
  AG_CHECK(x.size(-1) == K, "linear", "cannot multiply shapes ", x.sizes(), " and ", weight.sizes(),
           "^T: ", x.size(-1), " != ", K);
  if (bias.defined()) {
    detail::check_same_device(x, bias, "linear");
    AG_CHECK(x.dtype() == weight.dtype() && bias.dtype() == x.dtype(), "linear",
             "expected input, weight and bias to have one dtype, got ", dtype_name(x.dtype()), ", ",
             dtype_name(weight.dtype()), " and ", dtype_name(bias.dtype()));
    AG_CHECK(bias.dim() == 1 && bias.size(0) == N, "linear", "bias must have shape [", N,
             "] for weight of shape ", weight.sizes(), ", got ", bias.sizes());
  } else {
    AG_CHECK(x.dtype() == weight.dtype(), "linear", "expected input and weight to have one dtype, got ",
             dtype_name(x.dtype()), " and ", dtype_name(weight.dtype()));
  }
  AG_CHECK(x.is_floating_point(), "linear", "expected floating operands, got ", dtype_name(x.dtype()));

  const Tensor x2 = x.dim() == 2 ? x : reshape(x, {leading_rows(x), K});
  Tensor out = make_tensor({x2.size(0), N}, x.dtype(), x.device());
  backend(x.device(), "linear").linear(x2, weight, bias, out);
  if (any_requires_grad({&x2, &weight, &bias}))
    record("linear", {x2, weight, bias}, {out},
           [sx = detail::save_if(x2, weight.requires_grad()), sw = detail::save_if(weight, x2.requires_grad()),
            dx = gradient_dtype(x2), dw = gradient_dtype(weight)](const TensorList& g, GradMask need) -> TensorList {
             Tensor gx, gw, gb;
             if (need[0]) gx = matmul_nd(g[0], sw.get(), dx);
             if (need[1]) gw = matmul_nd(transpose(g[0], 0, 1), sx.get(), dw);
             if (need[2]) gb = sum(g[0], {0});
             return {gx, gw, gb};
           });
  if (x.dim() == 2) return out;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  return reshape(out, shape);
}

}  // namespace ampgrad
