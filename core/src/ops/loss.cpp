// Losses. cross_entropy with class-index targets is one fused backend call each way
// (log-softmax and NLL per position: Backend::cross_entropy / cross_entropy_backward) and
// records one node, which saves the logits, the int64 target and the per-position
// log-sum-exp; its reduction (Mean, Sum) is made of frontend ops after it. The other
// losses are composed from frontend ops (log_softmax, gather, where, sum) so that their
// gradients come from those ops; binary_cross_entropy_with_logits records its own node,
// because its stable forward form has kinks that its true gradient does not.
//
// Class-index targets follow PyTorch: logits [N, C, d...] (or [C]) against int64/int32
// targets [N, d...] (or a 0-dim one); targets equal to ignore_index contribute nothing and
// are not counted by Mean; label smoothing mixes in the mean over classes of -log p with
// weight label_smoothing. Any other target outside [0, C) is an error naming it (found by
// the cross_entropy kernels themselves; nll_loss checks CPU targets here).
//
// Reference: kernels/reference/include/ampgrad/reference/loss.h (float64, the specification).
#include "ampgrad/ops/loss.h"

#include "ampgrad/dispatch.h"
#include "ampgrad/factories.h"
#include "ampgrad/ops/elementwise.h"
#include "ampgrad/ops/nn.h"
#include "ampgrad/ops/reduce.h"
#include "ampgrad/ops/shape.h"
#include "internal.h"

namespace ampgrad {

namespace {

Tensor reduce_loss(const Tensor& loss, Reduction r) {
  switch (r) {
    case Reduction::None: return loss;
    case Reduction::Sum: return sum(loss);
    case Reduction::Mean: return mean(loss);
  }
  AG_ERROR("loss", "unknown reduction ", int(r));
}

// Checks a class-index target's dtype and shape against input [N, C, d...] / [C] and
// returns it as contiguous int64. The values are not checked here (check_target_range).
Tensor class_target(const Tensor& input, const Tensor& target, const char* op) {
  detail::check_defined(target, op, "target");
  detail::check_same_device(input, target, op);
  AG_CHECK(target.dtype() == kInt64 || target.dtype() == kInt32, op,
           "target must hold class indices as int64 or int32, got ", dtype_name(target.dtype()));
  AG_CHECK(input.dim() >= 1, op, "input must have a class dim, got a 0-dim tensor");
  const int64_t cdim = input.dim() == 1 ? 0 : 1;
  Shape expected = input.sizes();
  expected.erase(size_t(cdim));
  AG_CHECK(target.sizes() == expected, op, "target of shape ", target.sizes(),
           " does not match the input of shape ", input.sizes(), " (expected a target of shape ",
           expected, ")");
  return detail::contiguous_raw(detail::cast_raw(target, kInt64));
}

// Every target of a CPU int64 tensor t is ignore_index or in [0, C) (the message is the one
// the CPU cross_entropy kernel gives). Targets on a device are not read back here.
void check_target_range(const Tensor& t, int64_t C, int64_t ignore_index, const char* op) {
  if (!t.device().is_cpu()) return;
  const int64_t* p = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    AG_CHECK(p[i] == ignore_index || (p[i] >= 0 && p[i] < C), op, "target ", p[i], " is out of range for ", C,
             " classes (expected [0, ", C - 1, "] or ignore_index ", ignore_index, ")");
}

// -input[target] per target element (0 where ignored), and the mask of counted targets.
std::pair<Tensor, Tensor> pick_negated(const Tensor& log_probs, const Tensor& target, int64_t ignore_index) {
  const int64_t cdim = log_probs.dim() == 1 ? 0 : 1;
  Tensor valid = ne(target, Scalar(ignore_index));
  Tensor safe = where(valid, target, 0);
  Tensor picked = squeeze(gather(log_probs, cdim, unsqueeze(safe, cdim)), cdim);
  return {where(valid, neg(picked), 0.0), valid};
}

// Mean over the counted targets (NaN when none is counted, like PyTorch).
Tensor masked_mean(const Tensor& loss, const Tensor& valid) {
  return div(sum(loss), sum(valid).to(loss.dtype()));
}

}  // namespace

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, Reduction reduction, int64_t ignore_index) {
  if (auto in = dispatch::autocast(op::nll_loss, log_probs, target))
    return nll_loss((*in)[0], (*in)[1], reduction, ignore_index);
  detail::check_defined(log_probs, op::nll_loss, "input");
  AG_CHECK(is_floating(log_probs.dtype()), op::nll_loss, "input must be floating, got ",
           dtype_name(log_probs.dtype()));
  const Tensor t = class_target(log_probs, target, op::nll_loss);
  check_target_range(t, log_probs.sizes()[log_probs.dim() == 1 ? 0 : 1], ignore_index, op::nll_loss);
  auto [loss, valid] = pick_negated(log_probs, t, ignore_index);
  return reduction == Reduction::Mean ? masked_mean(loss, valid) : reduce_loss(loss, reduction);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction, int64_t ignore_index,
                     double label_smoothing) {
  if (auto in = dispatch::autocast(op::cross_entropy, logits, target))
    return cross_entropy((*in)[0], (*in)[1], reduction, ignore_index, label_smoothing);
  detail::check_defined(logits, op::cross_entropy, "input");
  detail::check_defined(target, op::cross_entropy, "target");
  AG_CHECK(is_floating(logits.dtype()), op::cross_entropy, "input must be floating, got ",
           dtype_name(logits.dtype()));
  AG_CHECK(label_smoothing >= 0 && label_smoothing <= 1, op::cross_entropy,
           "label_smoothing must be in [0, 1], got ", label_smoothing);
  AG_CHECK(logits.dim() >= 1, op::cross_entropy, "input must have a class dim, got a 0-dim tensor");
  const int64_t cdim = logits.dim() == 1 ? 0 : 1;
  const int64_t C = logits.sizes()[size_t(cdim)];
  if (is_floating(target.dtype())) {  // class probabilities, shaped like the logits
    AG_CHECK(target.sizes() == logits.sizes(), op::cross_entropy, "a probability target must have the input's shape ",
             logits.sizes(), ", got ", target.sizes());
    const Tensor lsm = log_softmax(logits, cdim);
    Tensor p = label_smoothing > 0 ? add(mul(target, 1.0 - label_smoothing), label_smoothing / double(C)) : target;
    Tensor loss = neg(sum(mul(lsm, p), {cdim}));
    return reduce_loss(loss, reduction);
  }

  // Class indices: one fused kernel per direction over [outer, C, inner] (the kernel checks
  // the targets' range).
  const Tensor t = class_target(logits, target, op::cross_entropy);
  int64_t inner = 1;
  for (int64_t d = cdim + 1; d < logits.dim(); ++d) inner *= logits.sizes()[size_t(d)];
  const DType dt = logits.dtype();
  const Tensor xc = detail::contiguous_raw(logits);
  Tensor loss = make_tensor(t.sizes(), dt, logits.device());
  Tensor lse = make_tensor(t.sizes(), dt == kFloat64 ? kFloat64 : kFloat32, logits.device());
  backend(logits.device(), op::cross_entropy).cross_entropy(xc, C, inner, t, ignore_index, label_smoothing, loss, lse);
  if (any_requires_grad({&logits}))
    record(op::cross_entropy, {logits}, {loss},
           [sx = SavedTensor(xc), st = SavedTensor(t), sl = SavedTensor(lse), C, inner, ignore_index,
            label_smoothing](const TensorList& g, GradMask) -> TensorList {
             const Tensor& x = sx.get();
             const Tensor gc = detail::contiguous_raw(detail::cast_raw(g[0], x.dtype()));
             Tensor gi = make_tensor(x.sizes(), x.dtype(), x.device());
             backend(x.device(), op::cross_entropy)
                 .cross_entropy_backward(gc, x, C, inner, st.get(), ignore_index, label_smoothing, sl.get(), gi);
             return {gi};
           });
  if (reduction != Reduction::Mean) return reduce_loss(loss, reduction);
  return masked_mean(loss, ne(t, Scalar(ignore_index)));
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  if (auto in = dispatch::autocast(op::mse_loss, input, target)) return mse_loss((*in)[0], (*in)[1], reduction);
  detail::check_defined(input, op::mse_loss, "input");
  detail::check_defined(target, op::mse_loss, "target");
  AG_CHECK(input.sizes() == target.sizes(), op::mse_loss, "input of shape ", input.sizes(),
           " and target of shape ", target.sizes(), " must have one shape");
  AG_CHECK(is_floating(input.dtype()), op::mse_loss, "input must be floating, got ", dtype_name(input.dtype()));
  return reduce_loss(square(sub(input, target)), reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target, Reduction reduction) {
  if (auto in = dispatch::autocast(op::binary_cross_entropy_with_logits, logits, target))
    return binary_cross_entropy_with_logits((*in)[0], (*in)[1], reduction);
  const char* name = op::binary_cross_entropy_with_logits;
  detail::check_defined(logits, name, "input");
  detail::check_defined(target, name, "target");
  detail::check_same_device(logits, target, name);
  AG_CHECK(logits.sizes() == target.sizes(), name, "target of shape ", target.sizes(),
           " must have the input's shape ", logits.sizes());
  AG_CHECK(is_floating(logits.dtype()), name, "input must be floating, got ", dtype_name(logits.dtype()));
  const DType dt = promote_types(logits.dtype(), target.dtype());
  Tensor loss;
  {
    // max(x, 0) - x y + log(1 + exp(-|x|)): never exponentiates a positive number.
    NoGradGuard no_grad;
    const Tensor x = detail::cast_raw(logits, dt), y = detail::cast_raw(target, dt);
    loss = add(sub(relu(x), mul(x, y)), log1p(exp(neg(abs(x)))));
  }
  if (any_requires_grad({&logits, &target}))
    record(name, {logits, target}, {loss},
           [sx = SavedTensor(logits), sy = SavedTensor(target), dt](const TensorList& g,
                                                                   GradMask need) -> TensorList {
             const Tensor x = sx.get().to(dt), y = sy.get().to(dt);
             return {need[0] ? mul(g[0], sub(sigmoid(x), y)) : Tensor(),  // d/dx = sigmoid(x) - y
                     need[1] ? mul(g[0], neg(x)) : Tensor()};            // d/dy = -x
           });
  return reduce_loss(loss, reduction);
}

}  // namespace ampgrad
