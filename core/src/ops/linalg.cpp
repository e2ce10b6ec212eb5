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
  detail::check_defined(a, op::matmul, "the first operand");
  detail::check_defined(b, op::matmul, "the second operand");
  detail::check_same_device(a, b, op::matmul);
  AG_CHECK(a.dtype() == b.dtype(), op::matmul, "expected both operands to have one dtype, got ",
           dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
  AG_CHECK(a.is_floating_point(), op::matmul, "expected floating operands, got ", dtype_name(a.dtype()));
  AG_CHECK(a.dim() >= 1 && b.dim() >= 1, op::matmul, "both operands need at least 1 dim, got shapes ",
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
  AG_CHECK(b.size(-2) == K, op::matmul, "cannot multiply shapes ", a.sizes(), " and ", b.sizes(), ": ",
           K, " != ", b.size(-2));
  Tensor out;
  if (a.dim() == 2 && b.dim() == 2) {  // the hot path: no broadcasting to work out
    out = make_tensor({M, N}, out_dtype, a.device(), op::matmul);
    backend(a.device(), op::matmul)
        .matmul(detail::one_batch(a), detail::one_batch(b), detail::one_batch(out));
  } else {
    const Shape batch = broadcast_shapes(batch_dims(a), batch_dims(b), op::matmul);
    const int64_t B = batch.numel();
    Shape shape = batch;
    shape.push_back(M);
    shape.push_back(N);
    out = make_tensor(shape, out_dtype, a.device(), op::matmul);
    backend(a.device(), op::matmul)
        .matmul(as_batch3(a, batch, B), as_batch3(b, batch, B),
                detail::make_view(out, {B, M, N}, {M * N, N, 1}, 0));
  }
  if (any_requires_grad({&a, &b}))
    record(op::matmul, {a, b}, {out},
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
  if (auto in = dispatch::autocast(op::matmul, a, b)) return matmul((*in)[0], (*in)[1]);
  check_operands(a, b);
  const int64_t ka = a.size(-1), kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  AG_CHECK(ka == kb, op::matmul, "cannot multiply shapes ", a.sizes(), " and ", b.sizes(), ": ", ka,
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

namespace {

// The checks of linear's operands; op names the caller.
void check_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const char* op) {
  detail::check_defined(x, op, "input");
  detail::check_defined(weight, op, "weight");
  detail::check_same_device(x, weight, op);
  AG_CHECK(weight.dim() == 2, op, "weight must be 2-D [out_features, in_features], got shape ", weight.sizes());
  AG_CHECK(x.dim() >= 1, op, "input must have at least 1 dim, got shape ", x.sizes());
  const int64_t K = weight.size(1), N = weight.size(0);
  AG_CHECK(x.size(-1) == K, op, "cannot multiply shapes ", x.sizes(), " and ", weight.sizes(), "^T: ", x.size(-1),
           " != ", K);
  if (bias.defined()) {
    detail::check_same_device(x, bias, op);
    AG_CHECK(x.dtype() == weight.dtype() && bias.dtype() == x.dtype(), op,
             "expected input, weight and bias to have one dtype, got ", dtype_name(x.dtype()), ", ",
             dtype_name(weight.dtype()), " and ", dtype_name(bias.dtype()));
    AG_CHECK(bias.dim() == 1 && bias.size(0) == N, op, "bias must have shape [", N, "] for weight of shape ",
             weight.sizes(), ", got ", bias.sizes());
  } else {
    AG_CHECK(x.dtype() == weight.dtype(), op, "expected input and weight to have one dtype, got ",
             dtype_name(x.dtype()), " and ", dtype_name(weight.dtype()));
  }
  AG_CHECK(x.is_floating_point(), op, "expected floating operands, got ", dtype_name(x.dtype()));
}

// x [..., K] as the [rows, K] matrix the backend multiplies.
Tensor as_rows(const Tensor& x) { return x.dim() == 2 ? x : reshape(x, {leading_rows(x), x.size(-1)}); }

// out2 [rows, N] back to x's leading dims.
Tensor like_input(const Tensor& out2, const Tensor& x) {
  if (x.dim() == 2) return out2;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = out2.size(1);
  return reshape(out2, shape);
}

// The gradient of the pre-activation of out = act(h) [M, N] from g: the gradient of out
// itself, or (next_weight [N2, N] defined) that of the product out @ next_weight^T. Also
// that of h's bias when wanted. One backend call; `out` is read only for ReLU.
std::pair<Tensor, Tensor> pre_activation_grad(const Tensor& g, const Tensor& next_weight, const Tensor& out,
                                              const Tensor& saved, Activation act, bool want_bias) {
  const Tensor gc = detail::contiguous_raw(g);
  const int64_t N = next_weight.defined() ? next_weight.size(1) : gc.size(1);
  Tensor gp = make_tensor({gc.size(0), N}, gc.dtype(), gc.device());
  Tensor gb = want_bias ? make_tensor({N}, gc.dtype(), gc.device()) : Tensor();
  backend(gc.device(), op::linear).linear_act_backward(gc, next_weight, out, saved, act, gp, gb);
  return {gp, gb};
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (auto in = dispatch::autocast(op::linear, x, weight, bias)) return linear((*in)[0], (*in)[1], (*in)[2]);
  check_linear(x, weight, bias, op::linear);
  const int64_t N = weight.size(0);
  const Tensor x2 = as_rows(x);
  Tensor out = make_tensor({x2.size(0), N}, x.dtype(), x.device());
  backend(x.device(), op::linear).linear(x2, weight, bias, out);
  if (any_requires_grad({&x2, &weight, &bias}))
    record(op::linear, {x2, weight, bias}, {out},
           [sx = detail::save_if(x2, weight.requires_grad()), sw = detail::save_if(weight, x2.requires_grad()),
            dx = gradient_dtype(x2), dw = gradient_dtype(weight)](const TensorList& g, GradMask need) -> TensorList {
             Tensor gx, gw, gb;
             if (need[0]) gx = matmul_nd(g[0], sw.get(), dx);
             if (need[1]) gw = matmul_nd(transpose(g[0], 0, 1), sx.get(), dw);
             if (need[2]) gb = sum(g[0], {0});
             return {gx, gw, gb};
           });
  return like_input(out, x);
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act) {
  if (act == Activation::None) return linear(x, weight, bias);
  if (auto in = dispatch::autocast(op::linear, x, weight, bias)) return linear((*in)[0], (*in)[1], (*in)[2], act);
  check_linear(x, weight, bias, op::linear);
  const Tensor x2 = as_rows(x);
  Tensor out = make_tensor({x2.size(0), weight.size(0)}, x.dtype(), x.device());
  const bool grad = any_requires_grad({&x2, &weight, &bias});
  // aux: what the backend keeps for GELU (the pre-activation, or on the CPU its slope) or a
  // backend's ReLU mask; internal, so kept by value. The single product's gradient reads
  // out itself for ReLU, so only GELU keeps something here.
  const Tensor aux =
      backend(x.device(), op::linear).linear_act(x2, weight, bias, act, out, grad && !activation_grad_reads_output(act));
  if (grad)
    record(op::linear, {x2, weight, bias}, {out},
           [sx = detail::save_if(x2, weight.requires_grad()), sw = detail::save_if(weight, x2.requires_grad()),
            sy = detail::save_if(out, activation_grad_reads_output(act)), aux, act, dx = gradient_dtype(x2),
            dw = gradient_dtype(weight)](const TensorList& g, GradMask need) -> TensorList {
             static const Tensor none;
             const Tensor& y = sy.defined() ? sy.get() : none;
             auto [gp, gb] = pre_activation_grad(g[0], Tensor(), y, aux, act, need[2]);
             Tensor gx, gw;
             if (need[0]) gx = matmul_nd(gp, sw.get(), dx);
             if (need[1]) gw = matmul_nd(transpose(gp, 0, 1), sx.get(), dw);
             return {gx, gw, gb};
           });
  return like_input(out, x);
}

Tensor feed_forward(const Tensor& x, const Tensor& w1, const Tensor& b1, Activation act, const Tensor& w2,
                    const Tensor& b2) {
  if (act == Activation::None) return linear(linear(x, w1, b1), w2, b2);
  if (auto in = dispatch::autocast(op::feed_forward, std::vector<Tensor>{x, w1, b1, w2, b2}))
    return feed_forward((*in)[0], (*in)[1], (*in)[2], act, (*in)[3], (*in)[4]);
  check_linear(x, w1, b1, op::feed_forward);
  detail::check_defined(w2, op::feed_forward, "second weight");
  detail::check_same_device(x, w2, op::feed_forward);
  AG_CHECK(w2.dim() == 2 && w2.size(1) == w1.size(0), op::feed_forward, "the second weight must have shape [out, ",
           w1.size(0), "] after a first weight of shape ", w1.sizes(), ", got ", w2.sizes());
  AG_CHECK(w2.dtype() == x.dtype(), op::feed_forward, "expected both weights to have the input's dtype ",
           dtype_name(x.dtype()), ", got ", dtype_name(w2.dtype()));
  if (b2.defined()) {
    detail::check_same_device(x, b2, op::feed_forward);
    AG_CHECK(b2.dtype() == x.dtype() && b2.dim() == 1 && b2.size(0) == w2.size(0), op::feed_forward,
             "the second bias must be a ", dtype_name(x.dtype()), " tensor of shape [", w2.size(0), "], got ",
             dtype_name(b2.dtype()), " ", b2.sizes());
  }
  const Tensor x2 = as_rows(x);
  Backend& be = backend(x.device(), op::feed_forward);
  Tensor h = make_tensor({x2.size(0), w1.size(0)}, x.dtype(), x.device());
  Tensor out = make_tensor({x2.size(0), w2.size(0)}, x.dtype(), x.device());
  const bool grad = any_requires_grad({&x2, &w1, &b1, &w2, &b2});
  // h = act(x @ w1^T + b1) and aux stay internal to the node: kept by value.
  const Tensor aux = be.linear_act(x2, w1, b1, act, h, grad);
  be.linear(h, w2, b2, out);
  if (grad)
    record(op::feed_forward, {x2, w1, b1, w2, b2}, {out},
           [sx = detail::save_if(x2, w1.requires_grad()), sw1 = detail::save_if(w1, x2.requires_grad()), sw2 = SavedTensor(w2), h, aux,
            act, dx = gradient_dtype(x2), dw1 = gradient_dtype(w1),
            dw2 = gradient_dtype(w2)](const TensorList& g, GradMask need) -> TensorList {
             Tensor gx, gw1, gb1, gw2, gb2;
             if (need[3]) gw2 = matmul_nd(transpose(g[0], 0, 1), h, dw2);
             if (need[4]) gb2 = sum(g[0], {0});
             if (need[0] || need[1] || need[2]) {
               // act'(pre) * (g @ w2) in one product with the gradient in its epilogue.
               Tensor gp;
               std::tie(gp, gb1) = pre_activation_grad(g[0], sw2.get(), h, aux, act, need[2]);
               if (need[0]) gx = matmul_nd(gp, sw1.get(), dx);
               if (need[1]) gw1 = matmul_nd(transpose(gp, 0, 1), sx.get(), dw1);
             }
             return {gx, gw1, gb1, gw2, gb2};
           });
  return like_input(out, x);
}

}  // namespace ampgrad
