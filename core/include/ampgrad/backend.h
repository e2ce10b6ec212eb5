// The backend interface: one object per device type, filled by kernels/cpu and kernels/cuda.
//
// The op frontend (core/src/ops) validates, promotes and broadcasts, calls exactly one of
// these entry points, and records autograd. Kernels therefore see checked inputs of the
// dtype they compute in, already broadcast to the output's shape (broadcast dims have
// stride 0), and outputs that are allocated and sized. Unless said otherwise, inputs may
// have any strides and outputs are contiguous. The elementwise entries binary, compare and
// where take each value operand as an Operand: a tensor, or a scalar passed by value. A
// backend that lacks an entry inherits the default, which throws "[op] not implemented on
// <device>".
//
// A build without CUDA links kernels/cuda/stub.cpp, whose cuda_backend() throws
// "[op] ampgrad was built without CUDA"; nothing outside kernels/ tests for CUDA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ampgrad/op_ids.h"
#include "ampgrad/op_kinds.h"
#include "ampgrad/stream.h"
#include "ampgrad/tensor.h"
#include "ampgrad/update_rounding.h"

namespace ampgrad {

/// A value operand of the elementwise entries (binary, compare, where): a tensor, or a
/// scalar passed by value. A tensor operand is like any kernel input: broadcast to the
/// output's shape, of the dtype the kernel computes in. A scalar operand is a value that
/// the kernel converts once to that dtype, exactly as fill converts a value (an integer
/// one from int64, so that no int64 is rounded through double), and keeps in a register:
/// `t * 2.0` allocates nothing for the 2.0 and reads nothing from memory for it. An Operand
/// refers to its tensor without owning it; it is an argument, valid for the call.
class Operand {
 public:
  Operand(const Tensor& t) : tensor_(&t) {}  // NOLINT: implicit, a tensor is an operand
  /// A scalar, converted to the kernel's dtype as fill converts a double.
  static Operand scalar(double v) {
    Operand o;
    o.value_ = v;
    return o;
  }
  /// An integral scalar, converted from int64 (as a copy from an int64 tensor converts).
  static Operand integer(int64_t v) {
    Operand o;
    o.int_value_ = v;
    o.integer_ = true;
    return o;
  }

  bool is_scalar() const { return tensor_ == nullptr; }
  /// The tensor of a tensor operand.
  const Tensor& tensor() const { return *tensor_; }
  /// A scalar operand's value: int_value() when is_integer(), else value().
  bool is_integer() const { return integer_; }
  double value() const { return value_; }
  int64_t int_value() const { return int_value_; }

 private:
  Operand() = default;
  const Tensor* tensor_ = nullptr;
  double value_ = 0;
  int64_t int_value_ = 0;
  bool integer_ = false;
};

struct Conv2dParams {
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
  int64_t groups = 1;
};

/// conv2d's output shape [N, OC, OH, OW] for an input of shape x and a weight of shape w.
Shape conv2d_output_shape(const Shape& x, const Shape& w, const Conv2dParams& p);

struct Pool2dParams {
  int64_t kernel[2] = {1, 1};
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
  bool ceil_mode = false;
  bool count_include_pad = true;  // avg_pool2d
};

/// The learning rate of an optimizer step: a host value, or (when `tensor` is defined) a
/// one-element float64 tensor on the parameters' device, which a device-side schedule
/// writes without the host reading it.
struct LearningRate {
  double value = 0;
  Tensor tensor;
};

/// The lists of one fused optimizer step: every parameter of a group that has a gradient
/// and shares a device and dtype. Lists are parallel and of one length (state lists may be
/// empty where the optimizer keeps no such state). params[i] and grads[i] are contiguous
/// and of one dtype; state is float32; masters[i] (float32) is updated instead of
/// params[i] when defined, and params[i] receives its rounding; steps[i] (int64, one
/// element) counts the updates applied to params[i] and is incremented by the step.
/// found_inf (float32, one element, or undefined): when nonzero the whole call writes
/// nothing — parameters, state and step counters keep their values (a step the grad scaler
/// skips, decided on the device) — except casts.
/// casts (empty, or one per parameter; only for backends whose optimizer_writes_casts()):
/// where casts[i] is defined (contiguous, float16 or bfloat16, params[i]'s shape; params[i]
/// float32 without a master), it receives params[i]'s value after the call rounded to its
/// dtype, as to_dtype rounds, also when found_inf skips the update.
/// rounding: how a float16/bfloat16 params[i] without a master stores its new value (the
/// value computed in float32; float32/float64 parameters ignore it; Master is Nearest here,
/// the masters list saying which parameters have one):
/// - Stochastic: element e of params[i] is rounded by kernels::stochastic_*_bits with the
///   draw kernels::rounding_draw(seed, e, ids[i], steps[i]) (steps[i] before the increment;
///   ampgrad/stochastic_round.h), so the result depends on neither the thread count nor
///   the backend.
/// - Compensated: comps[i] (params[i]'s dtype and shape) carries Kahan's compensation c:
///   with the update u (the rule's change of w in float32: -lr * d for SGD; for Adam(W)
///   -step_size * m / (sqrt(v) + eps) plus, with decoupled decay, -lr * wd * w), y = u + c,
///   w' = round(w + y), c' = round(y - (w' - w)), in float32 with round() to the dtype.
/// ids: one per parameter where rounding is Stochastic (else may be empty): its index in
/// the optimizer. comps: one per parameter where rounding is Compensated (undefined for a
/// parameter that is not 16-bit or has a master), else empty.
/// stalled (int64, 1-D with one element per listed parameter, contiguous, on the
/// parameters' device, or undefined): the step adds to element i the number of elements of
/// params[i], when float16/bfloat16, whose update was nonzero but whose stored value (the
/// master where there is one) compares equal to its old value; the element of another
/// dtype's parameter is left as it is, and a skipped step adds nothing. The
/// update is nonzero where lr * d != 0 (SGD), or where step_size * m / (sqrt(v) + eps) != 0
/// or the decoupled decay applies to a nonzero w (Adam(W)).
struct OptimizerLists {
  TensorList params, grads, buf1, buf2, masters, steps, casts, comps;
  LearningRate lr;
  Tensor found_inf;
  UpdateRounding rounding = UpdateRounding::Nearest;
  uint64_t seed = 0;
  std::vector<int64_t> ids;
  Tensor stalled;
  /// What every backend's step checks first: the lists have one length (state lists may be
  /// empty), both moment lists are there when `two_moments`, and found_inf, when defined,
  /// is a float32 tensor of one element. Throws ag::Error naming `op`.
  void check(const char* op, bool two_moments) const;
};

/// SGD (PyTorch's rule): d = g + wd * w; with momentum, buf = (first step: steps[i] == 0) ?
/// d : momentum * buf + (1 - dampening) * d and d = nesterov ? d + momentum * buf : buf;
/// w -= lr * d. buf1 holds the momentum buffers (empty without momentum).
struct SgdParams {
  double momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};

/// Adam / AdamW (PyTorch's rule) at the 1-based step t = steps[i] + 1, with buf1 = exp_avg
/// and buf2 = exp_avg_sq; decoupled applies the weight decay as w *= 1 - lr * wd (AdamW)
/// instead of adding wd * w to the gradient (Adam). The update is written with the bias
/// corrections folded into two per-parameter constants, as in Kingma and Ba's paper:
/// w -= (lr * sqrt(1 - beta2^t) / (1 - beta1^t)) * exp_avg / (sqrt(exp_avg_sq) +
/// eps * sqrt(1 - beta2^t)), equal to PyTorch's lr / (1 - beta1^t) * exp_avg /
/// (sqrt(exp_avg_sq) / sqrt(1 - beta2^t) + eps) but for rounding, with one division per
/// element instead of two.
struct AdamParams {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled = false;
};

/// The grad scaler's update rule (PyTorch's _amp_update_scale_, plus bounds): on an
/// overflow the scale is multiplied by backoff_factor (not below min_scale) and the growth
/// tracker reset to 0; otherwise the tracker counts one more clean iteration, and when it
/// reaches growth_interval the scale is multiplied by growth_factor (kept only if finite
/// as a float32, and capped at max_scale) and the tracker restarts at 0.
struct ScaleUpdateRule {
  double growth_factor = 2, backoff_factor = 0.5, min_scale = 0, max_scale = 0;
  int64_t growth_interval = 2000;
};

/// The scalars of one scaled dot-product attention (the attention entries): scores are
/// scale * q k^T plus the mask; with `causal`, key j is visible to query i only when j <= i
/// (PyTorch's is_causal, aligned at the top left). With dropout_p > 0 each probability
/// (b, i, j) of batch entry b (the batch dims flattened row-major) is kept when
/// uniform01(Philox(seed, offset + (b * Tq + i) * Tk + j)) over 53 bits (ampgrad/philox.h,
/// the float64 draw of Backend::uniform) is below 1 - dropout_p, and scaled by
/// 1 / (1 - dropout_p); the caller reserves the N * Tq * Tk counters. The row's
/// normaliser is taken before dropout, as in PyTorch.
struct AttentionParams {
  double scale = 1;
  bool causal = false;
  double dropout_p = 0;
  uint64_t seed = 0, offset = 0;
};

/// The sizes of one attention call, q [batch..., Tq, D], k [batch..., Tk, D] and
/// v [batch..., Tk, Dv]: N batch entries (the batch dims flattened row-major).
struct AttentionSizes {
  int64_t N = 1, Tq, Tk, D, Dv;
  AttentionSizes(const Tensor& q, const Tensor& k, const Tensor& v)
      : Tq(q.size(-2)), Tk(k.size(-2)), D(q.size(-1)), Dv(v.size(-1)) {
    for (int64_t i = 0; i + 2 < q.dim(); ++i) N *= q.size(i);
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceType device_type() const = 0;
  /// Whether binary(op, ...) also takes float16 and bfloat16 tensor operands for a float32
  /// out, widening each element as a cast would, so the result is the cast-then-op result
  /// bit for bit without the cast's pass over memory (a float32 residual plus a 16-bit
  /// branch under autocast). false here: the op casts the operands first.
  virtual bool binary_widens(BinaryOp op) const { return false; }
  /// Whether sgd_step and adam_step take OptimizerLists::casts: the 16-bit rounding of each
  /// updated float32 parameter written in the step's own pass, so that autocast's next cast
  /// of it is a read of that rounding (ampgrad/autograd.h, cast shadows). false here: the
  /// optimizer passes no casts, and autocast casts each parameter again.
  virtual bool optimizer_writes_casts() const { return false; }
  /// Whether layer_norm writes a 16-bit y from float32 x and layer_norm_backward reads a
  /// 16-bit grad_out for it: the norm and the cast after it in one pass (autocast runs
  /// layer norm in float32 and the next product casts its output). false here: the op
  /// writes float32 and casts.
  virtual bool layer_norm_narrows() const { return false; }

  // ---- memory ------------------------------------------------------------------------
  // Memory is stream-ordered: a block is allocated for use on a stream and freed on it.
  // Core does the bookkeeping above that (ampgrad/stream.h): it remembers each storage's
  // stream, and frees a storage used on other streams only once an event recorded on each
  // has completed, so a backend never sees a free that other streams still depend on.

  /// A block from allocate: its address, and whether the backend served it from blocks it
  /// kept from earlier frees (a cache hit) rather than asking the system.
  struct Allocation {
    void* data = nullptr;
    bool from_cache = false;
  };
  /// nbytes on stream.device(), for use on `stream`.
  virtual Allocation allocate(size_t nbytes, Stream stream) = 0;
  /// Frees a block from allocate, after the work queued on `stream` (the storage's own).
  virtual void deallocate(void* p, size_t nbytes, Stream stream) = 0;
  /// Page-locked host memory that this device copies from without the host waiting (CUDA:
  /// cudaHostAlloc). The default is ordinary CPU memory from the CPU backend.
  virtual Allocation allocate_pinned(size_t nbytes);
  virtual void deallocate_pinned(void* p, size_t nbytes);
  /// Bytes in freed blocks the backend keeps for reuse on a device (0 by default).
  virtual size_t cached_bytes(int device_index);
  /// Returns those blocks to the system (nothing by default).
  virtual void empty_cache(int device_index);
  /// Devices of this type present (the CPU: 1; CUDA: 0 without a GPU or driver).
  virtual int device_count();
  /// Copies n contiguous bytes between this device and the CPU (or within this device),
  /// queued on `stream`, a stream of this device. Blocking copies return when the bytes
  /// have arrived; non-blocking ones may return before (asynchronous only from pinned
  /// host memory or within the device; core asks for it only when copying to a device).
  virtual void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n,
                          Stream stream, bool non_blocking);

  // ---- streams and events -------------------------------------------------------------
  // Core numbers the streams (ag::Stream is a (device, id) value) and keeps the native handle
  // that create_stream returned for each; a backend reads it back with stream_handle(). The
  // default stream's handle is null (CUDA: the legacy default stream). Kernels queue their
  // work on the current stream of their device, stream_handle(current_stream(device)).
  virtual void* create_stream(int device_index);
  /// Releases stream s, whose handle create_stream returned, and what the backend keeps for
  /// it; core has already made the default stream wait for its work.
  virtual void destroy_stream(Stream s, void* handle);
  /// The host waits for the work queued on s.
  virtual void synchronize_stream(Stream s);
  /// True when the work queued on s has finished; never waits.
  virtual bool query_stream(Stream s);
  /// The host waits for all work on the device.
  virtual void synchronize_device(int device_index);
  /// An opaque event of the backend; core creates it on an Event's first record.
  virtual void* create_event(int device_index, bool enable_timing);
  virtual void destroy_event(int device_index, void* event);
  /// Captures the work queued on s so far.
  virtual void record_event(void* event, Stream s);
  /// Work queued on s later runs after the event's work; the host does not wait.
  virtual void stream_wait_event(Stream s, void* event);
  virtual void synchronize_event(void* event);
  virtual bool query_event(void* event);
  /// Milliseconds between two recorded, completed timing events.
  virtual double event_elapsed_ms(void* start, void* end);

  // ---- data movement -----------------------------------------------------------------
  /// dst = src elementwise, converting dtype; src is broadcast to dst's shape; dst may be a
  /// strided view (in-place writes go through here).
  virtual void copy(const Tensor& src, const Tensor& dst);
  /// Sets every element of dst (possibly strided) to value.
  virtual void fill(const Tensor& dst, double value);

  // ---- elementwise (out may be a strided view for in-place ops) -----------------------
  virtual void unary(UnaryOp op, const Tensor& x, const Tensor& out, UnaryParams p);
  /// out = op(a, b) in out's dtype; at least one of a and b is a tensor. Tensor operands
  /// have out's dtype, except where binary_widens(op) says otherwise.
  virtual void binary(BinaryOp op, const Operand& a, const Operand& b, const Tensor& out);
  /// out is bool; a and b share a dtype (a scalar takes the tensor operand's); at least one
  /// of them is a tensor.
  virtual void compare(CompareOp op, const Operand& a, const Operand& b, const Tensor& out);
  /// out = cond ? a : b; cond is a bool tensor, a and b are in out's dtype (either or both
  /// may be scalars).
  virtual void where(const Tensor& cond, const Operand& a, const Operand& b, const Tensor& out);

  // ---- reductions --------------------------------------------------------------------
  /// Reduces x over `dims` (sorted, unique, non-negative) into out, which has x's rank
  /// with the reduced dims of size 1 (keepdim layout). Floating inputs accumulate in
  /// float32 (float64 for float64). ArgMax/ArgMin write int64.
  virtual void reduce(ReduceOp op, const Tensor& x, const Shape& dims, const Tensor& out,
                      ReduceParams p);
  /// Max (or min) along one dim with the int64 index of the first extreme; values and
  /// indices have x's rank with `dim` of size 1.
  virtual void max_min_dim(bool is_max, const Tensor& x, int64_t dim, const Tensor& values,
                           const Tensor& indices);

  // ---- random (counter-based: element i of out uses stream (seed, offset + i)) -------
  virtual void uniform(const Tensor& out, double low, double high, uint64_t seed, uint64_t offset);
  virtual void normal(const Tensor& out, double mean, double std, uint64_t seed, uint64_t offset);

  // ---- indexing (index is int64, contiguous) ------------------------------------------
  /// out = x.index_select(dim, index).
  virtual void index_select(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out);
  /// out.narrow-like slices out[..., index[i], ...] += src[..., i, ...] (out contiguous).
  virtual void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);
  /// out[i][j] = x[index[i][j]][j] along dim (index has out's shape).
  virtual void gather(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out);
  /// out[index[i][j]][j] += src[i][j] along dim (out contiguous).
  virtual void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);

  // ---- matrix products ---------------------------------------------------------------
  /// out[b] = a[b] @ w[b]: a [B, M, K], w [B, K, N] with any strides (a batch stride may be
  /// 0), out [B, M, N] contiguous; accumulation in float32. a and w share one dtype; out has
  /// it too, or is float32 when a and w are float16/bfloat16 (the product is then not rounded
  /// to 16 bits: mixed-precision weight gradients, see gradient_dtype).
  virtual void matmul(const Tensor& a, const Tensor& w, const Tensor& out);
  /// out = x @ weight^T + bias: x [M, K], weight [N, K], bias [N] or undefined, out [M, N].
  virtual void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out);
  /// out = act(x @ weight^T + bias), shapes as in linear; act is not None. When `keep`, the
  /// result is what linear_act_backward needs besides out, in the backend's own form: for
  /// GELU (out's shape and dtype) the pre-activation on CUDA and in the composed form, the
  /// slope act'(h) on the CPU (computed with the value, so its backward is one product
  /// scaled in the epilogue); for ReLU nothing on the CPU and, on CUDA, the bit mask of
  /// cuBLASLt's RELU_AUX epilogue where the product ran with it. Undefined when nothing is
  /// needed or `keep` is false.
  virtual Tensor linear_act(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                            const Tensor& out, bool keep);
  /// The gradient of the pre-activation h of a linear_act (out = act(h), saved = its result):
  /// grad_pre [M, N] = act'(h) * (g @ next_weight) for g [M, N2] and next_weight [N2, N]
  /// (the product that read out: one GEMM with the activation's gradient in its epilogue),
  /// or act'(h) * g for g [M, N] when next_weight is undefined. grad_bias [N], when defined,
  /// receives the sum of grad_pre over rows. g and grad_pre are contiguous, in out's dtype.
  virtual void linear_act_backward(const Tensor& g, const Tensor& next_weight, const Tensor& out,
                                   const Tensor& saved, Activation act, const Tensor& grad_pre,
                                   const Tensor& grad_bias);

  // ---- convolution and pooling (NCHW, contiguous inputs) ------------------------------
  virtual void conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                      const Conv2dParams& p);
  virtual void conv2d_backward_input(const Tensor& grad_out, const Tensor& w,
                                     const Tensor& grad_in, const Conv2dParams& p);
  /// grad_bias may be undefined.
  virtual void conv2d_backward_weight(const Tensor& grad_out, const Tensor& x,
                                      const Tensor& grad_w, const Tensor& grad_bias,
                                      const Conv2dParams& p);
  /// Returns what backward needs to route gradients (an index tensor or a workspace).
  virtual Tensor max_pool2d(const Tensor& x, const Tensor& out, const Pool2dParams& p);
  virtual void max_pool2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& saved,
                                   const Tensor& grad_in, const Pool2dParams& p);
  virtual void avg_pool2d(const Tensor& x, const Tensor& out, const Pool2dParams& p);
  virtual void avg_pool2d_backward(const Tensor& grad_out, const Tensor& grad_in,
                                   const Pool2dParams& p);
  /// out = max_pool2d(act(conv2d(x, w) + bias)) for act None or Relu: a CNN's conv block
  /// as one entry, so that a backend can keep the full-size activation in its own layout
  /// between the three (oneDNN: blocked, with no reorder of it either way). bias may be
  /// undefined. Returns what conv2d_block_backward needs besides x and w, in a form only
  /// this backend reads.
  virtual TensorList conv2d_block(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                                  const Conv2dParams& p, Activation act, const Pool2dParams& pool);
  /// The gradients of conv2d_block for g (out's shape): grad_x, grad_w and grad_bias are
  /// written where defined (each may be undefined: not wanted).
  virtual void conv2d_block_backward(const Tensor& g, const Tensor& x, const Tensor& w, const TensorList& saved,
                                     const Conv2dParams& p, Activation act, const Pool2dParams& pool,
                                     const Tensor& grad_x, const Tensor& grad_w, const Tensor& grad_bias);

  // ---- normalisation -----------------------------------------------------------------
  /// Softmax (or log-softmax) of contiguous x along dim.
  virtual void softmax(const Tensor& x, int64_t dim, bool log, const Tensor& out);
  /// Gradient from the saved output y.
  virtual void softmax_backward(const Tensor& grad_out, const Tensor& y, int64_t dim, bool log,
                                const Tensor& grad_in);
  /// Layer norm over the last `inner` elements of contiguous x. weight/bias [inner] or
  /// undefined. mean and rstd are float32 (float64 for float64 x), one per row. y has x's
  /// dtype, or, where layer_norm_narrows(), float16 or bfloat16 for float32 x: the float32
  /// result rounded as to_dtype rounds.
  virtual void layer_norm(const Tensor& x, int64_t inner, const Tensor& weight, const Tensor& bias,
                          double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd);
  /// grad_w/grad_b may be undefined (no weight, or not needed); grad_in may be undefined.
  /// grad_out has x's dtype, or, where layer_norm_narrows(), float16 or bfloat16 for
  /// float32 x (widened exactly as it is read); the gradients have x's dtype.
  virtual void layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean,
                                   const Tensor& rstd, const Tensor& weight, const Tensor& grad_in,
                                   const Tensor& grad_w, const Tensor& grad_b);
  /// The row length layer_norm_backward works on: the parameter gradients' length where
  /// one is given, else x's elements per row of mean (0 for no rows).
  static int64_t layer_norm_inner(const Tensor& x, const Tensor& mean, const Tensor& grad_w, const Tensor& grad_b);

  // ---- losses ------------------------------------------------------------------------
  /// Cross entropy with class-index targets, log-softmax and NLL in one pass. x is
  /// contiguous, read as [outer, classes, inner] (logits [N, C, d...] have inner = d1 * ...;
  /// [N, C] and a 1-D [C] have inner = 1); target is int64, contiguous, one class index per
  /// position (outer * inner of them). Per position p, with lse = log-sum-exp of x over the
  /// classes and ls = label_smoothing:
  ///   loss[p] = (1 - ls) * (lse - x[target]) + ls * (lse - mean over classes of x),
  /// and 0 where target == ignore_index. loss has x's dtype and is computed in float32
  /// (float64 for float64 x); lse (float32, float64 for float64 x) is written for every
  /// position and saved for backward. A target that is neither ignore_index nor in
  /// [0, classes) is an error naming it: the CPU throws, CUDA reports it into the device
  /// error slot (raised at the next host wait).
  virtual void cross_entropy(const Tensor& x, int64_t classes, int64_t inner, const Tensor& target,
                             int64_t ignore_index, double label_smoothing, const Tensor& loss,
                             const Tensor& lse);
  /// grad_x[p, c] = grad_loss[p] * (softmax(x)[p, c] - (1 - ls) * [c == target[p]] - ls / classes),
  /// 0 at ignored positions; softmax comes from the saved lse. grad_loss (x's dtype,
  /// contiguous) has one value per position; grad_x is contiguous, shaped like x.
  virtual void cross_entropy_backward(const Tensor& grad_loss, const Tensor& x, int64_t classes,
                                      int64_t inner, const Tensor& target, int64_t ignore_index,
                                      double label_smoothing, const Tensor& lse, const Tensor& grad_x);

  // ---- attention ---------------------------------------------------------------------
  /// Scaled dot-product attention: out = softmax(scale * q k^T + mask) v per batch entry,
  /// with AttentionParams' causal rule and dropout. q [batch..., Tq, D], k [batch..., Tk, D],
  /// v [batch..., Tk, Dv] share one floating dtype and one batch shape, any strides. mask is
  /// undefined or additive (-inf hides a key), in the accumulation dtype (float32; float64
  /// for float64 inputs), broadcast to [batch..., Tq, Tk] (stride-0 dims). out
  /// [batch..., Tq, Dv] (q's dtype) has unit-stride, non-overlapping rows and any other
  /// strides (the op lays it out as [batch'..., Tq, H, Dv]); lse [batch..., Tq]
  /// (accumulation dtype) is contiguous and receives each row's log-sum-exp of the masked
  /// scores, or +inf for a row with no visible key, whose output is 0. Computed in float32
  /// (float64 for float64).
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                         const AttentionParams& p, const Tensor& out, const Tensor& lse);
  /// The gradients of attention from its saved out and lse (the probabilities are
  /// exp(score - lse): 0 for a row with lse = +inf, so such a row's gradients are 0).
  /// grad_out is shaped like out, in its dtype, any strides; grad_q, grad_k and grad_v are
  /// shaped like q, k and v with unit-stride, non-overlapping rows and any other strides
  /// (the op lays them out like q, k and v when those are slices of one buffer), or
  /// undefined when that gradient is not wanted.
  virtual void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& mask, const Tensor& out, const Tensor& lse,
                                  const AttentionParams& p, const Tensor& grad_q, const Tensor& grad_k,
                                  const Tensor& grad_v);

  // ---- optimizers: one call steps every listed parameter (see OptimizerLists) --------------
  virtual void sgd_step(const OptimizerLists& lists, const SgdParams& p);
  virtual void adam_step(const OptimizerLists& lists, const AdamParams& p);

  // ---- multi-tensor helpers (the grad scaler, gradient clipping) ---------------------
  /// For every tensor of the list (contiguous, floating, one device): x *= factor in place,
  /// computed in float32 (float64 for float64 tensors), where factor is a one-element
  /// float32 or float64 tensor on the device. When found_inf (float32, one element) is
  /// defined, it is set to 1 if any element of any tensor was inf or NaN before scaling; it
  /// is never cleared here, so one flag can collect several calls. Nothing is read back to
  /// the host.
  virtual void scale_and_check(const TensorList& xs, const Tensor& factor, const Tensor& found_inf);
  /// out (float32, one element) = the sum of the squares of every element of every tensor
  /// of the list (contiguous, floating, one device), accumulated in float32 per tensor and
  /// in float64 across tensors.
  virtual void sum_of_squares(const TensorList& xs, const Tensor& out);
  /// Applies ScaleUpdateRule on the device: scale (float64, one element), growth_tracker
  /// (int64, one element) and found_inf (float32, one element; nonzero: an overflow).
  virtual void update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                            const ScaleUpdateRule& rule);

 protected:
  // The two linear_act entries composed from this backend's own linear, matmul, unary, binary
  // and reduce: what a backend runs where it has no fused form (the CPU for ReLU's gradient,
  // CUDA where cuBLASLt offers no algorithm with the epilogue). The composed linear_act
  // keeps the pre-activation for GELU and nothing for ReLU.
  Tensor linear_act_composed(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                             const Tensor& out, bool keep);
  void linear_act_backward_composed(const Tensor& g, const Tensor& next_weight, const Tensor& out,
                                    const Tensor& pre, Activation act, const Tensor& grad_pre,
                                    const Tensor& grad_bias);
  // The two conv2d_block entries composed from this backend's conv2d, unary, max_pool2d and
  // their backwards (what a backend without a fused form runs, and the CPU's fallback
  // where the activation holds a NaN): saved is {the activation, max_pool2d's result}.
  TensorList conv2d_block_composed(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                                   const Conv2dParams& p, Activation act, const Pool2dParams& pool);
  void conv2d_block_backward_composed(const Tensor& g, const Tensor& x, const Tensor& w, const TensorList& saved,
                                      const Conv2dParams& p, Activation act, const Pool2dParams& pool,
                                      const Tensor& grad_x, const Tensor& grad_w, const Tensor& grad_bias);
  // The two attention entries composed from this backend's own matmul, binary, unary,
  // compare, where, reduce, softmax_backward, uniform and copies: the [N, Tq, Tk] scores
  // and probabilities are materialised (float32; float64 for float64). What a backend
  // without a fused kernel runs (CUDA); same contract and same dropout mask as the entries.
  void attention_composed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                          const AttentionParams& p, const Tensor& out, const Tensor& lse);
  void attention_backward_composed(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& mask, const Tensor& out, const Tensor& lse,
                                   const AttentionParams& p, const Tensor& grad_q, const Tensor& grad_k,
                                   const Tensor& grad_v);
};

/// The backend of a device type. `op` names the caller in the error raised when the device
/// type is not available in this build.
Backend& backend(DeviceType type, const char* op);
inline Backend& backend(const Device& d, const char* op) { return backend(d.type, op); }

/// Implemented by kernels/cpu.
Backend& cpu_backend();
/// Implemented by kernels/cuda (or its stub, which throws naming `op`).
Backend& cuda_backend(const char* op);
/// True when this build includes the CUDA backend.
bool built_with_cuda();
/// True when that backend runs on the CUDA emulator (-DAMPGRAD_CUDA=EMULATE: its kernels
/// compiled as C++ and run on the CPU; docs/cuda-emulator.md).
bool cuda_emulated();
/// True when this build includes oneDNN.
bool built_with_onednn();
/// The backend of the accelerator that pins host memory and copies from it (CUDA, when
/// this build has it and a device is present), or null (the CPU alone).
Backend* accelerator_backend();

/// The native handle that s's backend returned from create_stream (null for a default
/// stream). A destroyed stream gives null too: its device's default stream, which was made
/// to wait for its work. Never throws; core checks the streams a user passes.
void* stream_handle(Stream s);

}  // namespace ampgrad
