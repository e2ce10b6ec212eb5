// Convolution and pooling (NCHW): argument checks, output sizes, and backward.
//
// A 3-D input is one unbatched image (as in PyTorch): it gets a batch dim of 1 on the way
// in and loses it on the way out. Kernels get contiguous tensors. conv2d's backward calls
// the backend's backward-data and backward-weights kernels (the latter also sums the bias
// gradient); it saves the input only when the weight needs a gradient and the weight only
// when the input does. max_pool2d saves what its kernel returns (argmax indices or a
// workspace) to route the gradient. conv2d_block (conv, activation, max pooling as one op)
// saves the input and the weight (its backend needs their shapes even for the bias's
// gradient alone) and what the backend returned.
#include <array>

#include "ampgrad/dispatch.h"
#include "ampgrad/factories.h"
#include "ampgrad/ops/nn.h"
#include "ampgrad/ops/shape.h"
#include "internal.h"

namespace ampgrad {
namespace {

// A per-dim argument given for both dims (one value) or each (two).
std::array<int64_t, 2> pair_arg(const std::vector<int64_t>& v, const char* op, const char* what) {
  AG_CHECK(v.size() == 1 || v.size() == 2, op, what, " must have 1 or 2 values, got ", v);
  return {v[0], v.back()};
}

void check_input_4d(const Tensor& x, const char* op) {
  detail::check_defined(x, op, "input");
  AG_CHECK(x.dim() == 3 || x.dim() == 4, op, "expected a 3-D (unbatched) or 4-D (batched) input, got shape ",
           x.sizes());
  AG_CHECK(x.is_floating_point(), op, "expected a floating input, got ", dtype_name(x.dtype()));
}

// floor(a / b) and ceil(a / b) for b > 0 and any a, without overflow.
int64_t floor_div(int64_t a, int64_t b) { return a / b - (a % b != 0 && a < 0); }
int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 && a > 0); }

// PyTorch's pooling output size, including ceil_mode's rule that the last window must
// start inside the input or its left padding. k, s, d > 0 and pad >= 0 are checked; the
// arithmetic is too, as huge arguments would overflow it.
int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t pad, int64_t d, bool ceil, const char* op) {
  const int64_t span = checked_mul(d, k - 1, op, "the dilated kernel size");  // d * (k - 1)
  const int64_t padded = checked_add(in, checked_mul(2, pad, op, "the padding"), op, "the padded input size");
  const int64_t num = padded - span - 1;  // both >= 0: cannot overflow
  int64_t o = (ceil ? ceil_div(num, s) : floor_div(num, s)) + 1;
  if (ceil && o >= 1 && (o - 1) * s >= in + pad) --o;  // o >= 1: (o - 1) * s <= num fits
  return o;
}

struct PoolSetup {
  Pool2dParams p;
  int64_t oh = 0, ow = 0;
};

PoolSetup pool_setup(const Shape& x, const std::vector<int64_t>& kernel, const std::vector<int64_t>& stride,
                     const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation,
                     bool ceil_mode, const char* op) {
  PoolSetup s;
  const auto k = pair_arg(kernel, op, "kernel_size");
  const auto st = stride.empty() ? k : pair_arg(stride, op, "stride");
  const auto pad = pair_arg(padding, op, "padding");
  const auto dil = pair_arg(dilation, op, "dilation");
  for (int i = 0; i < 2; ++i) {
    AG_CHECK(k[i] > 0 && st[i] > 0 && dil[i] > 0, op, "kernel_size, stride and dilation must be positive, got ",
             std::vector<int64_t>{k[0], k[1]}, ", ", std::vector<int64_t>{st[0], st[1]}, " and ",
             std::vector<int64_t>{dil[0], dil[1]});
    AG_CHECK(pad[i] >= 0 && pad[i] <= k[i] / 2, op, "padding must be between 0 and half the kernel size, got padding ",
             std::vector<int64_t>{pad[0], pad[1]}, " for kernel_size ", std::vector<int64_t>{k[0], k[1]});
    s.p.kernel[i] = k[i];
    s.p.stride[i] = st[i];
    s.p.padding[i] = pad[i];
    s.p.dilation[i] = dil[i];
  }
  s.p.ceil_mode = ceil_mode;
  s.oh = pool_out(x[x.size() - 2], k[0], st[0], pad[0], dil[0], ceil_mode, op);
  s.ow = pool_out(x[x.size() - 1], k[1], st[1], pad[1], dil[1], ceil_mode, op);
  AG_CHECK(s.oh > 0 && s.ow > 0, op, "input of shape ", x, " is too small for kernel_size ",
           std::vector<int64_t>{k[0], k[1]}, " with padding ", std::vector<int64_t>{pad[0], pad[1]},
           " and dilation ", std::vector<int64_t>{dil[0], dil[1]}, ": the output would be [", s.oh, ", ",
           s.ow, "]");
  return s;
}

Shape pool_out_shape(const Shape& x, const PoolSetup& s) { return {x[0], x[1], s.oh, s.ow}; }

// conv2d's argument checks for a 4-D input (the op named `op`): the backend's parameters
// and the output's shape.
struct ConvSetup {
  Conv2dParams p;
  Shape out;
};

ConvSetup conv_setup(const Tensor& x, const Tensor& weight, const Tensor& bias, const std::vector<int64_t>& stride,
                     const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, int64_t groups,
                     const char* op) {
  ConvSetup cs;
  Conv2dParams& p = cs.p;
  AG_CHECK(weight.dim() == 4, op, "weight must be 4-D [out_channels, in_channels / groups, kH, kW], got shape ",
           weight.sizes());
  detail::check_same_device(x, weight, op);
  if (bias.defined()) detail::check_same_device(x, bias, op);
  AG_CHECK(weight.dtype() == x.dtype() && (!bias.defined() || bias.dtype() == x.dtype()), op,
           "expected input, weight and bias to have one dtype, got ", dtype_name(x.dtype()), ", ",
           dtype_name(weight.dtype()), " and ", bias.defined() ? dtype_name(bias.dtype()) : "no bias");
  AG_CHECK(groups > 0, op, "groups must be positive, got ", groups);
  const int64_t C = x.size(1), OC = weight.size(0);
  AG_CHECK(OC % groups == 0, op, "out_channels ", OC, " of weight of shape ", weight.sizes(),
           " is not divisible by groups=", groups);
  const int64_t expect_c = checked_mul(weight.size(1), groups, op, "in_channels / groups * groups");
  AG_CHECK(expect_c == C, op, "input of shape ", x.sizes(), " has ", C, " channels, but weight of shape ",
           weight.sizes(), " with groups=", groups, " expects ", expect_c);
  AG_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == OC), op, "bias must have shape [",
           OC, "], got ", bias.defined() ? bias.sizes() : Shape());

  p.groups = groups;
  const auto st = pair_arg(stride, op, "stride"), pad = pair_arg(padding, op, "padding"),
             dil = pair_arg(dilation, op, "dilation");
  int64_t out_hw[2];
  for (int i = 0; i < 2; ++i) {
    AG_CHECK(st[i] > 0 && dil[i] > 0 && pad[i] >= 0, op,
             "stride and dilation must be positive and padding non-negative, got stride ",
             std::vector<int64_t>{st[0], st[1]}, ", padding ", std::vector<int64_t>{pad[0], pad[1]},
             ", dilation ", std::vector<int64_t>{dil[0], dil[1]});
    p.stride[i] = st[i];
    p.padding[i] = pad[i];
    p.dilation[i] = dil[i];
  }
  // The dilated kernel and the padded input, checked: huge dilation or padding would wrap.
  const auto dilated = [&](int i) {
    return checked_add(checked_mul(dil[i], weight.size(2 + i) - 1, op, "the dilated kernel size"), 1,
                       op, "the dilated kernel size");
  };
  const auto padded = [&](int i) {
    return checked_add(x.size(2 + i), checked_mul(2, pad[i], op, "the padding"), op,
                       "the padded input size");
  };
  const int64_t ekh = dilated(0), ekw = dilated(1), ph = padded(0), pw = padded(1);
  AG_CHECK(ekh <= ph && ekw <= pw, op, "kernel of shape ", weight.sizes(), " (dilated size [", ekh,
           ", ", ekw, "]) is larger than the padded input of size [", ph, ", ", pw, "] (input shape ",
           x.sizes(), ", padding ", std::vector<int64_t>{pad[0], pad[1]}, ")");
  out_hw[0] = (ph - ekh) / st[0] + 1;
  out_hw[1] = (pw - ekw) / st[1] + 1;

  cs.out = {x.size(0), OC, out_hw[0], out_hw[1]};
  return cs;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, std::vector<int64_t> stride,
              std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups) {
  if (auto in = dispatch::autocast(op::conv2d, x, weight, bias))
    return conv2d((*in)[0], (*in)[1], (*in)[2], stride, padding, dilation, groups);
  check_input_4d(x, op::conv2d);
  detail::check_defined(weight, op::conv2d, "weight");
  if (x.dim() == 3)
    return squeeze(conv2d(unsqueeze(x, 0), weight, bias, stride, padding, dilation, groups), 0);
  const ConvSetup cs = conv_setup(x, weight, bias, stride, padding, dilation, groups, op::conv2d);
  const Conv2dParams& p = cs.p;
  const Tensor xc = detail::contiguous_raw(x), wc = detail::contiguous_raw(weight);
  const Tensor bc = bias.defined() ? detail::contiguous_raw(bias) : bias;
  Tensor out = make_tensor(cs.out, x.dtype(), x.device(), op::conv2d);
  backend(x.device(), op::conv2d).conv2d(xc, wc, bc, out, p);
  if (any_requires_grad({&x, &weight, &bias}))
    record(op::conv2d, {x, weight, bias}, {out},
           [sx = detail::save_if(xc, weight.requires_grad()), sw = detail::save_if(wc, x.requires_grad()), p,
            xs = x.sizes(), ws = weight.sizes()](const TensorList& g, GradMask need) -> TensorList {
             const Tensor gy = detail::contiguous_raw(g[0]);
             Backend& be = backend(gy.device(), op::conv2d);
             Tensor gx, gw, gb;
             if (need[0]) {
               gx = make_tensor(xs, gy.dtype(), gy.device());
               be.conv2d_backward_input(gy, sw.get(), gx, p);
             }
             if (need[1] || need[2]) {
               if (need[1]) gw = make_tensor(ws, gy.dtype(), gy.device());
               if (need[2]) gb = make_tensor({ws[0]}, gy.dtype(), gy.device());
               be.conv2d_backward_weight(gy, need[1] ? sx.get() : Tensor(), gw, gb, p);
             }
             return {gx, gw, gb};
           });
  return out;
}

Tensor max_pool2d(const Tensor& x, std::vector<int64_t> kernel_size, std::vector<int64_t> stride,
                  std::vector<int64_t> padding, std::vector<int64_t> dilation, bool ceil_mode) {
  check_input_4d(x, op::max_pool2d);
  if (x.dim() == 3)
    return squeeze(max_pool2d(unsqueeze(x, 0), kernel_size, stride, padding, dilation, ceil_mode), 0);
  const PoolSetup s = pool_setup(x.sizes(), kernel_size, stride, padding, dilation, ceil_mode, op::max_pool2d);
  const Tensor xc = detail::contiguous_raw(x);
  Tensor out = make_tensor(pool_out_shape(x.sizes(), s), x.dtype(), x.device(), op::max_pool2d);
  Tensor saved = backend(x.device(), op::max_pool2d).max_pool2d(xc, out, s.p);
  if (any_requires_grad({&x}))
    record(op::max_pool2d, {x}, {out},
           [sx = SavedTensor(xc), saved, p = s.p](const TensorList& g, GradMask) -> TensorList {
             const Tensor gy = detail::contiguous_raw(g[0]);
             const Tensor& xin = sx.get();
             Tensor gx = make_tensor(xin.sizes(), gy.dtype(), gy.device());
             backend(gy.device(), op::max_pool2d).max_pool2d_backward(gy, xin, saved, gx, p);
             return {gx};
           });
  return out;
}

Tensor avg_pool2d(const Tensor& x, std::vector<int64_t> kernel_size, std::vector<int64_t> stride,
                  std::vector<int64_t> padding, bool ceil_mode, bool count_include_pad) {
  check_input_4d(x, op::avg_pool2d);
  if (x.dim() == 3)
    return squeeze(avg_pool2d(unsqueeze(x, 0), kernel_size, stride, padding, ceil_mode, count_include_pad), 0);
  PoolSetup s = pool_setup(x.sizes(), kernel_size, stride, padding, {1, 1}, ceil_mode, op::avg_pool2d);
  s.p.count_include_pad = count_include_pad;
  Tensor out = make_tensor(pool_out_shape(x.sizes(), s), x.dtype(), x.device(), op::avg_pool2d);
  backend(x.device(), op::avg_pool2d).avg_pool2d(detail::contiguous_raw(x), out, s.p);
  if (any_requires_grad({&x}))
    record(op::avg_pool2d, {x}, {out}, [xs = x.sizes(), p = s.p](const TensorList& g, GradMask) -> TensorList {
      const Tensor gy = detail::contiguous_raw(g[0]);
      Tensor gx = make_tensor(xs, gy.dtype(), gy.device());
      backend(gy.device(), op::avg_pool2d).avg_pool2d_backward(gy, gx, p);
      return {gx};
    });
  return out;
}


Tensor conv2d_block(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dArgs& conv,
                    Activation act, const MaxPool2dArgs& pool) {
  static constexpr OpName kName = op::conv2d_block;
  if (auto in = dispatch::autocast(op::conv2d, x, weight, bias))
    return conv2d_block((*in)[0], (*in)[1], (*in)[2], conv, act, pool);
  check_input_4d(x, kName);
  detail::check_defined(weight, kName, "weight");
  AG_CHECK(act == Activation::None || act == Activation::Relu, kName, "the activation must be none or relu, got ",
           activation_name(act));
  if (x.dim() == 3) return squeeze(conv2d_block(unsqueeze(x, 0), weight, bias, conv, act, pool), 0);
  const ConvSetup cs = conv_setup(x, weight, bias, conv.stride, conv.padding, conv.dilation, conv.groups, kName);
  const PoolSetup ps =
      pool_setup(cs.out, pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.ceil_mode, kName);
  const Tensor xc = detail::contiguous_raw(x), wc = detail::contiguous_raw(weight);
  const Tensor bc = bias.defined() ? detail::contiguous_raw(bias) : bias;
  Tensor out = make_tensor(pool_out_shape(cs.out, ps), x.dtype(), x.device(), kName);
  TensorList saved = backend(x.device(), kName).conv2d_block(xc, wc, bc, out, cs.p, act, ps.p);
  if (any_requires_grad({&x, &weight, &bias}))
    record(kName, {x, weight, bias}, {out},
           [sx = SavedTensor(xc), sw = SavedTensor(wc), saved = std::move(saved), p = cs.p, pp = ps.p, act,
            xs = x.sizes(),
            ws = weight.sizes()](const TensorList& g, GradMask need) -> TensorList {
             const Tensor gy = detail::contiguous_raw(g[0]);
             Tensor gx, gw, gb;
             if (need[0]) gx = make_tensor(xs, gy.dtype(), gy.device());
             if (need[1]) gw = make_tensor(ws, gy.dtype(), gy.device());
             if (need[2]) gb = make_tensor({ws[0]}, gy.dtype(), gy.device());
             backend(gy.device(), kName)
                 .conv2d_block_backward(gy, sx.get(), sw.get(), saved, p, act, pp, gx, gw, gb);
             return {gx, gw, gb};
           });
  return out;
}

}  // namespace ampgrad
