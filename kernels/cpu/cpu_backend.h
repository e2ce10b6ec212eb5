// The CPU backend: Eigen and oneDNN (or Eigen alone) plus vectorised loops over OpenMP.
//
// One class; each kernel family lives in its own file (elementwise.cpp, reduce.cpp,
// norm.cpp, loss.cpp, attention.cpp, index.cpp, random.cpp, and onednn_*.cpp or eigen_*.cpp for the products,
// convolution and pooling, chosen by AMPGRAD_ONEDNN at configure time).
#pragma once

#include "ampgrad/backend.h"

namespace ampgrad::cpu {

class CpuBackend final : public Backend {
 public:
  /// Reads the kernels' instruction-set level (cpu/isa.h: AMPGRAD_KERNEL_ISA, an ag::Error
  /// for a bad value) here, with the first CPU tensor, rather than first inside a kernel's
  /// parallel region, where an error could not be thrown.
  CpuBackend();
  DeviceType device_type() const override { return DeviceType::CPU; }

  Allocation allocate(size_t nbytes, Stream stream) override;
  void deallocate(void* p, size_t nbytes, Stream stream) override;
  size_t cached_bytes(int device_index) override;
  void empty_cache(int device_index) override;
  int device_count() override { return 1; }
  void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n,
                  Stream stream, bool non_blocking) override;

  // Streams are synchronous (work is done when a call returns) and events complete when
  // recorded; they exist so that code written for an asynchronous device runs here too.
  void* create_stream(int device_index) override { return nullptr; }
  void destroy_stream(Stream s, void* handle) override {}
  void synchronize_stream(Stream s) override {}
  bool query_stream(Stream s) override { return true; }
  void synchronize_device(int device_index) override {}
  void* create_event(int device_index, bool enable_timing) override;
  void destroy_event(int device_index, void* event) override;
  void record_event(void* event, Stream s) override;
  void stream_wait_event(Stream s, void* event) override {}
  void synchronize_event(void* event) override {}
  bool query_event(void* event) override { return true; }
  double event_elapsed_ms(void* start, void* end) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, double value) override;

  void unary(UnaryOp op, const Tensor& x, const Tensor& out, UnaryParams p) override;
  void binary(BinaryOp op, const Operand& a, const Operand& b, const Tensor& out) override;
  bool binary_widens(BinaryOp op) const override;
  bool optimizer_writes_casts() const override { return true; }
  bool layer_norm_narrows() const override { return true; }
  void compare(CompareOp op, const Operand& a, const Operand& b, const Tensor& out) override;
  void where(const Tensor& cond, const Operand& a, const Operand& b, const Tensor& out) override;

  void reduce(ReduceOp op, const Tensor& x, const Shape& dims, const Tensor& out,
              ReduceParams p) override;
  void max_min_dim(bool is_max, const Tensor& x, int64_t dim, const Tensor& values,
                   const Tensor& indices) override;

  void uniform(const Tensor& out, double low, double high, uint64_t seed, uint64_t offset) override;
  void normal(const Tensor& out, double mean, double std, uint64_t seed, uint64_t offset) override;

  void index_select(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) override;
  void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) override;
  void gather(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) override;
  void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) override;

  void matmul(const Tensor& a, const Tensor& w, const Tensor& out) override;
  void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) override;
  Tensor linear_act(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act, const Tensor& out,
                    bool keep) override;
  void linear_act_backward(const Tensor& g, const Tensor& next_weight, const Tensor& out, const Tensor& saved,
                           Activation act, const Tensor& grad_pre, const Tensor& grad_bias) override;

  void conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
              const Conv2dParams& p) override;
  void conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Tensor& grad_in,
                             const Conv2dParams& p) override;
  void conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Tensor& grad_w,
                              const Tensor& grad_bias, const Conv2dParams& p) override;
  Tensor max_pool2d(const Tensor& x, const Tensor& out, const Pool2dParams& p) override;
  void max_pool2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& saved,
                           const Tensor& grad_in, const Pool2dParams& p) override;
  void avg_pool2d(const Tensor& x, const Tensor& out, const Pool2dParams& p) override;
  void avg_pool2d_backward(const Tensor& grad_out, const Tensor& grad_in,
                           const Pool2dParams& p) override;
#ifdef AMPGRAD_WITH_ONEDNN
  // The fused block (onednn_conv.cpp); without oneDNN it is Backend's composition.
  TensorList conv2d_block(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                          const Conv2dParams& p, Activation act, const Pool2dParams& pool) override;
  void conv2d_block_backward(const Tensor& g, const Tensor& x, const Tensor& w, const TensorList& saved,
                             const Conv2dParams& p, Activation act, const Pool2dParams& pool, const Tensor& grad_x,
                             const Tensor& grad_w, const Tensor& grad_bias) override;
#endif

  void softmax(const Tensor& x, int64_t dim, bool log, const Tensor& out) override;
  void softmax_backward(const Tensor& grad_out, const Tensor& y, int64_t dim, bool log,
                        const Tensor& grad_in) override;
  void layer_norm(const Tensor& x, int64_t inner, const Tensor& weight, const Tensor& bias,
                  double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd) override;
  void layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean,
                           const Tensor& rstd, const Tensor& weight, const Tensor& grad_in,
                           const Tensor& grad_w, const Tensor& grad_b) override;

  void cross_entropy(const Tensor& x, int64_t classes, int64_t inner, const Tensor& target, int64_t ignore_index,
                     double label_smoothing, const Tensor& loss, const Tensor& lse) override;
  void cross_entropy_backward(const Tensor& grad_loss, const Tensor& x, int64_t classes, int64_t inner,
                              const Tensor& target, int64_t ignore_index, double label_smoothing,
                              const Tensor& lse, const Tensor& grad_x) override;

  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const AttentionParams& p,
                 const Tensor& out, const Tensor& lse) override;
  void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& mask, const Tensor& out, const Tensor& lse, const AttentionParams& p,
                          const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v) override;

  void sgd_step(const OptimizerLists& lists, const SgdParams& p) override;
  void adam_step(const OptimizerLists& lists, const AdamParams& p) override;

  void scale_and_check(const TensorList& xs, const Tensor& factor, const Tensor& found_inf) override;
  void sum_of_squares(const TensorList& xs, const Tensor& out) override;
  void update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                    const ScaleUpdateRule& rule) override;

 private:
  // out = act(pre) and pre = act'(pre) in one pass (elementwise.cpp): what linear_act keeps
  // for GELU here, so that its backward is one product scaled by the slope.
  void activation_with_slope(Activation act, const Tensor& pre, const Tensor& out);
  // linear_act's kept result for an activation whose gradient reads its input (GELU):
  // out = act(h) and the returned act'(h), h = x @ weight^T + bias (cpu_backend.cpp).
  Tensor linear_act_with_slope(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                               const Tensor& out);
  // out = (a @ w) * mul elementwise, for matmul's [B, M, K] @ [B, K, N] operands and a
  // contiguous mul shaped and typed like out: oneDNN multiplies in the product's epilogue
  // (a binary post-op); elsewhere a second pass does.
  void matmul_times(const Tensor& a, const Tensor& w, const Tensor& mul, const Tensor& out);
};

}  // namespace ampgrad::cpu

namespace ampgrad::detail {
/// Number of oneDNN primitives cached by the CPU backend (matmul, linear, conv); 0 in a
/// build without oneDNN. Tests use it to check that repeated shapes create none.
size_t cpu_primitive_cache_size();
}  // namespace ampgrad::detail

