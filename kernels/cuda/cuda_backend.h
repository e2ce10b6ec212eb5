// The CUDA backend: cuBLASLt for the products, cuDNN for convolution, and our
// own kernels templated on float, half and bfloat16 (and the other dtypes where the op has
// them) for everything else, all queued on the current stream of the contract.
//
// One class; each family lives in its own file: backend.cu (memory, streams, events,
// errors), elementwise.cu (copy, fill, unary, binary, compare, where), random.cu,
// index.cu, reduce.cu, norm.cu (softmax, layer norm), loss.cu (cross entropy), blas.cu
// (matmul, linear), conv.cu (convolution through cuDNN, pooling), optim.cu (optimizers,
// grad scaler, clipping). The class declares every primitive entry of Backend, so one
// without a CUDA definition fails to link; the fused entries it has no fused form of
// (conv2d_block, attention) are Backend's compositions of the primitive ones.
#pragma once

#include "ampgrad/backend.h"

namespace ampgrad::cuda {

class CudaBackend final : public Backend {
 public:
  DeviceType device_type() const override { return DeviceType::CUDA; }

  // ---- memory, streams, events (backend.cu) ----
  Allocation allocate(size_t nbytes, Stream stream) override;
  void deallocate(void* p, size_t nbytes, Stream stream) override;
  Allocation allocate_pinned(size_t nbytes) override;
  void deallocate_pinned(void* p, size_t nbytes) override;
  size_t cached_bytes(int device_index) override;
  void empty_cache(int device_index) override;
  int device_count() override;
  void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n,
                  Stream stream, bool non_blocking) override;
  void* create_stream(int device_index) override;
  void destroy_stream(Stream s, void* handle) override;
  void synchronize_stream(Stream s) override;
  bool query_stream(Stream s) override;
  void synchronize_device(int device_index) override;
  void* create_event(int device_index, bool enable_timing) override;
  void destroy_event(int device_index, void* event) override;
  void record_event(void* event, Stream s) override;
  void stream_wait_event(Stream s, void* event) override;
  void synchronize_event(void* event) override;
  bool query_event(void* event) override;
  double event_elapsed_ms(void* start, void* end) override;

  // ---- kernels ----
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, double value) override;

  void unary(UnaryOp op, const Tensor& x, const Tensor& out, UnaryParams p) override;
  void binary(BinaryOp op, const Operand& a, const Operand& b, const Tensor& out) override;
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

  // conv2d_block and attention (and their backwards) are Backend's compositions of the
  // entries here: cuDNN's fused forms are for inference, and attention has no kernel yet.

  void sgd_step(const OptimizerLists& lists, const SgdParams& p) override;
  void adam_step(const OptimizerLists& lists, const AdamParams& p) override;

  void scale_and_check(const TensorList& xs, const Tensor& factor, const Tensor& found_inf) override;
  void sum_of_squares(const TensorList& xs, const Tensor& out) override;
  void update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                    const ScaleUpdateRule& rule) override;
};

/// The one instance (cuda_backend() returns it).
CudaBackend& backend_instance();

}  // namespace ampgrad::cuda
