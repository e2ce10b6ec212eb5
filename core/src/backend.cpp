// Backend selection, and the defaults that a backend without an entry point inherits.
#include "ampgrad/backend.h"

#include "internal.h"

namespace ampgrad {

Backend& backend(DeviceType type, const char* op) {
  if (type == DeviceType::CPU) return cpu_backend();
  return cuda_backend(op);
}

#define AG_MISSING(op) AG_ERROR(op, "not implemented on ", device_type_name(device_type()))

// Asked once: the devices present do not change while the process runs, and pinning asks
// for every batch.
Backend* accelerator_backend() {
  static Backend* const accelerator = []() -> Backend* {
    if (!built_with_cuda()) return nullptr;
    Backend& cuda = cuda_backend("accelerator");
    return cuda.device_count() > 0 ? &cuda : nullptr;
  }();
  return accelerator;
}

// Without page-locked memory of its own a backend hands out ordinary CPU memory.
Backend::Allocation Backend::allocate_pinned(size_t nbytes) { return cpu_backend().allocate(nbytes, Stream()); }
void Backend::deallocate_pinned(void* p, size_t nbytes) { cpu_backend().deallocate(p, nbytes, Stream()); }
size_t Backend::cached_bytes(int) { return 0; }
void Backend::empty_cache(int) {}
int Backend::device_count() { AG_MISSING("device_count"); }
void Backend::copy_bytes(void*, Device, const void*, Device, size_t, Stream, bool) { AG_MISSING("copy"); }

void* Backend::create_stream(int) { AG_MISSING("create_stream"); }
void Backend::destroy_stream(int, void*) { AG_MISSING("destroy_stream"); }
void Backend::synchronize_stream(Stream) { AG_MISSING("Stream::synchronize"); }
bool Backend::query_stream(Stream) { AG_MISSING("Stream::query"); }
void Backend::synchronize_device(int) { AG_MISSING("synchronize"); }
void* Backend::create_event(int, bool) { AG_MISSING("Event"); }
void Backend::destroy_event(int, void*) { AG_MISSING("Event"); }
void Backend::record_event(void*, Stream) { AG_MISSING("Event::record"); }
void Backend::stream_wait_event(Stream, void*) { AG_MISSING("Event::wait"); }
void Backend::synchronize_event(void*) { AG_MISSING("Event::synchronize"); }
bool Backend::query_event(void*) { AG_MISSING("Event::query"); }
double Backend::event_elapsed_ms(void*, void*) { AG_MISSING("Event::elapsed_time"); }

void Backend::copy(const Tensor&, const Tensor&) { AG_MISSING("copy"); }
void Backend::fill(const Tensor&, double) { AG_MISSING("fill"); }
void Backend::unary(UnaryOp op, const Tensor&, const Tensor&, UnaryParams) { AG_MISSING(op_name(op)); }
void Backend::binary(BinaryOp op, const Operand&, const Operand&, const Tensor&) { AG_MISSING(op_name(op)); }
void Backend::compare(CompareOp op, const Operand&, const Operand&, const Tensor&) { AG_MISSING(op_name(op)); }
void Backend::where(const Tensor&, const Operand&, const Operand&, const Tensor&) { AG_MISSING("where"); }
void Backend::reduce(ReduceOp op, const Tensor&, const Shape&, const Tensor&, ReduceParams) { AG_MISSING(op_name(op)); }
void Backend::max_min_dim(bool, const Tensor&, int64_t, const Tensor&, const Tensor&) { AG_MISSING("max"); }
void Backend::uniform(const Tensor&, double, double, uint64_t, uint64_t) { AG_MISSING("uniform"); }
void Backend::normal(const Tensor&, double, double, uint64_t, uint64_t) { AG_MISSING("normal"); }
void Backend::index_select(const Tensor&, int64_t, const Tensor&, const Tensor&) { AG_MISSING("index_select"); }
void Backend::index_add(const Tensor&, int64_t, const Tensor&, const Tensor&) { AG_MISSING("index_add"); }
void Backend::gather(const Tensor&, int64_t, const Tensor&, const Tensor&) { AG_MISSING("gather"); }
void Backend::scatter_add(const Tensor&, int64_t, const Tensor&, const Tensor&) { AG_MISSING("scatter_add"); }
void Backend::matmul(const Tensor&, const Tensor&, const Tensor&) { AG_MISSING("matmul"); }
void Backend::linear(const Tensor&, const Tensor&, const Tensor&, const Tensor&) { AG_MISSING("linear"); }
Tensor Backend::linear_act(const Tensor&, const Tensor&, const Tensor&, Activation, const Tensor&, bool) { AG_MISSING("linear"); }
void Backend::linear_act_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, Activation, const Tensor&, const Tensor&) { AG_MISSING("linear"); }
void Backend::conv2d(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&) { AG_MISSING("conv2d"); }
void Backend::conv2d_backward_input(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&) { AG_MISSING("conv2d"); }
void Backend::conv2d_backward_weight(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&) { AG_MISSING("conv2d"); }
Tensor Backend::max_pool2d(const Tensor&, const Tensor&, const Pool2dParams&) { AG_MISSING("max_pool2d"); }
void Backend::max_pool2d_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Pool2dParams&) { AG_MISSING("max_pool2d"); }
void Backend::avg_pool2d(const Tensor&, const Tensor&, const Pool2dParams&) { AG_MISSING("avg_pool2d"); }
void Backend::avg_pool2d_backward(const Tensor&, const Tensor&, const Pool2dParams&) { AG_MISSING("avg_pool2d"); }
void Backend::softmax(const Tensor&, int64_t, bool, const Tensor&) { AG_MISSING("softmax"); }
void Backend::softmax_backward(const Tensor&, const Tensor&, int64_t, bool, const Tensor&) { AG_MISSING("softmax"); }
void Backend::layer_norm(const Tensor&, int64_t, const Tensor&, const Tensor&, double, const Tensor&, const Tensor&, const Tensor&) { AG_MISSING("layer_norm"); }
void Backend::layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) { AG_MISSING("layer_norm"); }

void Backend::cross_entropy(const Tensor&, int64_t, int64_t, const Tensor&, int64_t, double, const Tensor&, const Tensor&) { AG_MISSING("cross_entropy"); }
void Backend::cross_entropy_backward(const Tensor&, const Tensor&, int64_t, int64_t, const Tensor&, int64_t, double, const Tensor&, const Tensor&) { AG_MISSING("cross_entropy"); }

void Backend::sgd_step(const OptimizerLists&, const SgdParams&) { AG_MISSING("SGD"); }
void Backend::adam_step(const OptimizerLists&, const AdamParams&) { AG_MISSING("Adam"); }
void Backend::scale_and_check(const TensorList&, const Tensor&, const Tensor&) { AG_MISSING("scale_and_check"); }
void Backend::sum_of_squares(const TensorList&, const Tensor&) { AG_MISSING("sum_of_squares"); }
void Backend::update_scale(const Tensor&, const Tensor&, const Tensor&, const ScaleUpdateRule&) { AG_MISSING("update_scale"); }

#undef AG_MISSING

void OptimizerLists::check(const char* op, bool two_moments) const {
  const size_t n = params.size();
  AG_CHECK(grads.size() == n && steps.size() == n && masters.size() == n && (buf1.empty() || buf1.size() == n) &&
               (buf2.empty() || buf2.size() == n),
           op, "parameter, gradient, state and step lists differ in length (", n, " parameters)");
  if (two_moments) AG_CHECK(buf1.size() == n && buf2.size() == n, op, "expected both moment lists");
  if (found_inf.defined())
    AG_CHECK(found_inf.dtype() == kFloat32 && found_inf.numel() == 1, op,
             "found_inf must be a float32 tensor of one element");
}

// ---- composed forms of the fused entries ------------------------------------------------

Tensor Backend::linear_act_composed(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                                    const Tensor& out, bool keep) {
  const bool keep_pre = keep && !activation_grad_reads_output(act);
  Tensor pre = keep_pre ? make_tensor(out.sizes(), out.dtype(), out.device()) : out;
  linear(x, weight, bias, pre);
  unary(activation_op(act), pre, out, {});  // in place when the pre-activation is not kept
  return keep_pre ? pre : Tensor();
}

void Backend::linear_act_backward_composed(const Tensor& g, const Tensor& next_weight, const Tensor& out,
                                           const Tensor& pre, Activation act, const Tensor& grad_pre,
                                           const Tensor& grad_bias) {
  const Tensor& saved = activation_grad_reads_output(act) ? out : pre;
  AG_CHECK(saved.defined(), "linear", "the gradient of ", activation_name(act), " needs the ",
           activation_grad_reads_output(act) ? "output" : "pre-activation", ", which was not kept");
  const int64_t M = grad_pre.size(0), N = grad_pre.size(1);
  if (next_weight.defined()) {
    const int64_t N2 = g.size(1);
    matmul(detail::make_view(g, {1, M, N2}, {0, g.stride(0), g.stride(1)}, g.storage_offset()),
           detail::make_view(next_weight, {1, N2, N}, {0, next_weight.stride(0), next_weight.stride(1)},
                             next_weight.storage_offset()),
           detail::make_view(grad_pre, {1, M, N}, {M * N, N, 1}, grad_pre.storage_offset()));
    binary(activation_backward_op(act), grad_pre, saved, grad_pre);
  } else {
    binary(activation_backward_op(act), g, saved, grad_pre);
  }
  if (grad_bias.defined())
    reduce(ReduceOp::Sum, grad_pre, Shape{0}, detail::make_view(grad_bias, {1, N}, {N, 1}, grad_bias.storage_offset()),
           {});
}

}  // namespace ampgrad
