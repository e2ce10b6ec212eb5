// Multi-tensor kernels of the contract on CUDA: the fused SGD and Adam/AdamW steps, the
// grad scaler's unscale-and-check and scale update, and the sum of squares of gradient
// clipping. Nothing here reads a value back to the host: found_inf, the learning rate, the
// scale and the step counters are device tensors that the kernels read and write.
//
// A list of tensors is cut into chunks of kChunk elements; one launch covers up to
// kMaxTensors tensors and kMaxBlocks chunks, described in a kernel argument (TensorChunks),
// as PyTorch's multi_tensor_apply does. A step over the GPT's ~50 parameters is a handful
// of launches, not one per parameter. The update rules are those of kernels/cpu/optim.cpp
// and amp.cpp, in the same order of operations, in float32 (float64 for float64).
//
// A float16/bfloat16 parameter without a master stores its new value as
// OptimizerLists::rounding says (ampgrad/stochastic_round.h for the stochastic draws, the
// same bits as on the CPU); the stalled count is summed per warp and added with one atomic
// per warp to the count of the warp's parameter (a block, hence a warp, works on one chunk
// of one tensor).
//
// Reference: kernels/reference/include/ampgrad/reference/optim.h and
//   kernels/reference/include/ampgrad/reference/grad_scaler.h (float64, the specification).
#include <algorithm>
#include <cmath>
#include <vector>

#include "ampgrad/factories.h"
#include "ampgrad/stochastic_round.h"
#include "cuda/common.cuh"
#include "cuda/cuda_backend.h"

namespace ampgrad::cuda {
namespace {

constexpr int kMaxTensors = 36;
constexpr int kMaxBlocks = 320;
constexpr int64_t kChunk = 65536;
constexpr int kOptThreads = 512;

// Up to kDepth pointers per tensor (parameter, gradient, states, master), the tensor's
// element count, step counter, id (OptimizerLists::ids) and index in the caller's list
// (its slot in OptimizerLists::stalled), and which (tensor, chunk) each block works on.
template <int kDepth>
struct TensorChunks {
  void* ptr[kDepth][kMaxTensors];
  int64_t numel[kMaxTensors];
  int64_t* step[kMaxTensors];
  int64_t id[kMaxTensors];
  int list_index[kMaxTensors];
  unsigned char block_tensor[kMaxBlocks];
  int block_chunk[kMaxBlocks];
};

// The tensor, and the element range of its chunk, that this block works on.
struct Chunk {
  int k;
  int64_t begin, end;
};
template <int kDepth>
__device__ __forceinline__ Chunk chunk_of(const TensorChunks<kDepth>& m) {
  const int k = m.block_tensor[blockIdx.x];
  const int64_t begin = int64_t(m.block_chunk[blockIdx.x]) * kChunk;
  return {k, begin, min(begin + kChunk, m.numel[k])};
}

// Calls launch(meta, blocks) for successive packs of the tensors' chunks. ptrs(k, d) gives
// pointer d of tensor k (null where a tensor has no such state); list_index[k] (k itself
// when empty) is what meta.list_index holds for tensor k.
template <int kDepth, class Ptrs, class Launch>
void for_each_pack(size_t n, const std::vector<int64_t>& numels, const std::vector<int64_t*>& steps,
                   const std::vector<int64_t>& ids, const std::vector<int>& list_index, const Ptrs& ptrs,
                   const Launch& launch) {
  TensorChunks<kDepth> meta{};
  int nt = 0, nb = 0;
  for (size_t k = 0; k < n; ++k) {
    const int64_t numel = numels[k];
    if (numel == 0) continue;
    for (int d = 0; d < kDepth; ++d) meta.ptr[d][nt] = ptrs(k, d);
    meta.numel[nt] = numel;
    meta.step[nt] = steps.empty() ? nullptr : steps[k];
    meta.id[nt] = ids.empty() ? 0 : ids[k];
    meta.list_index[nt] = list_index.empty() ? int(k) : list_index[k];
    const int64_t chunks = (numel + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      meta.block_tensor[nb] = (unsigned char)nt;
      meta.block_chunk[nb] = int(c);
      ++nb;
      const bool last_chunk = c == chunks - 1;
      if (nb == kMaxBlocks || (last_chunk && nt + 1 == kMaxTensors)) {
        launch(meta, nb);
        nb = 0;
        if (last_chunk) {
          nt = -1;  // the next tensor starts a fresh pack
        } else {    // the rest of this tensor's chunks continue in a fresh pack
          for (int d = 0; d < kDepth; ++d) meta.ptr[d][0] = meta.ptr[d][nt];
          meta.numel[0] = meta.numel[nt];
          meta.step[0] = meta.step[nt];
          meta.id[0] = meta.id[nt];
          meta.list_index[0] = meta.list_index[nt];
          nt = 0;
        }
      }
    }
    ++nt;
  }
  if (nb > 0) launch(meta, nb);
}

// The value of a one-element float32 or float64 device tensor.
struct DeviceScalar {
  const void* p = nullptr;
  bool is_double = false;
  double host = 0;  // used when p is null
  __device__ double get() const {
    if (!p) return host;
    return is_double ? *static_cast<const double*>(p) : double(*static_cast<const float*>(p));
  }
};

DeviceScalar device_scalar(const Tensor& t, double host, const char* op, const char* what) {
  DeviceScalar s;
  s.host = host;
  if (!t.defined()) return s;
  AG_CHECK(t.numel() == 1 && (t.dtype() == kFloat64 || t.dtype() == kFloat32), op, what,
           " must be a float64 or float32 tensor of one element");
  AG_CHECK(t.device().is_cuda(), op, what, " must be on the parameters' device, got ", t.device());
  s.p = t.raw_data();
  s.is_double = t.dtype() == kFloat64;
  return s;
}

const float* flag_ptr(const Tensor& f, const char* op) {
  if (!f.defined()) return nullptr;
  AG_CHECK(f.dtype() == kFloat32 && f.numel() == 1, op, "found_inf must be a float32 tensor of one element, got ",
           dtype_name(f.dtype()), " with ", f.numel(), " elements");
  // kernels write or read it: a host pointer would be an illegal address on the device
  AG_CHECK(f.device().is_cuda(), op, "found_inf must be on the tensors' device, got ", f.device());
  return static_cast<const float*>(f.raw_data());
}

// ---- optimizers ----------------------------------------------------------------------------
// How a kernel stores a 16-bit parameter's new value (OptimizerLists::rounding), and where
// it counts stalled elements.
enum Store { kPlain, kStochastic, kCompensated };
struct RoundArgs {
  int store = kPlain;
  uint64_t seed = 0;
  // OptimizerLists::stalled: the count of the pack's tensor k at stalled[m.list_index[k]];
  // null: no count
  unsigned long long* stalled = nullptr;
};

RoundArgs round_args(const OptimizerLists& l) {
  RoundArgs r;
  r.store = l.rounding == UpdateRounding::Stochastic    ? kStochastic
            : l.rounding == UpdateRounding::Compensated ? kCompensated
                                                        : kPlain;
  r.seed = l.seed;
  if (l.stalled.defined()) r.stalled = static_cast<unsigned long long*>(l.stalled.raw_data());
  return r;
}

// Stores w (w0 + delta as the rule computed it) into p[i] as r.store says (a parameter
// that is not 16-bit, or whose comp is null under kCompensated, is stored to nearest) and
// returns the stored value in A. Element i of tensor id at its step `step` draws its bits
// as on the CPU (kernels/cpu/optim.cpp's store_value).
template <class D, class A>
__device__ __forceinline__ A store_value(D* p, D* comp, int64_t i, A w0, A w, A delta, const RoundArgs& r, int64_t id,
                                         int64_t step) {
  D v;
  if constexpr (is_dev_half_v<D>) {
    if (r.store == kStochastic) {
      const uint32_t bits = kernels::rounding_draw(r.seed, i, id, step);
      if constexpr (std::is_same_v<D, __half>) v = __ushort_as_half(kernels::stochastic_half_bits(float(w), bits));
      else v = __ushort_as_bfloat16(kernels::stochastic_bf16_bits(float(w), bits));
    } else if (r.store == kCompensated && comp) {
      const A y = delta + convert<A>(comp[i]);
      v = convert<D>(w0 + y);
      comp[i] = convert<D>(y - (convert<A>(v) - w0));
    } else {
      v = convert<D>(w);
    }
  } else {
    v = convert<D>(w);
  }
  p[i] = v;
  return convert<A>(v);
}

// Adds each thread's count to *stalled: a warp's sum, one atomic per warp (all of a warp's
// threads work on the block's tensor, so they share the slot).
__device__ __forceinline__ void add_stalled(unsigned long long* stalled, unsigned n) {
  for (int o = 16; o > 0; o /= 2) n += __shfl_down_sync(0xffffffffu, n, o);
  if (threadIdx.x % 32 == 0 && n) atomicAdd(stalled, (unsigned long long)n);
}

struct SgdArgs {
  DeviceScalar lr;
  const float* found_inf;
  // double, converted in the kernel to its compute type as the CPU converts them (float64
  // parameters would otherwise see momentum and weight decay rounded to float)
  double momentum, damp, wd;  // damp = 1 - dampening
  bool nesterov;
  RoundArgs round;
};

// ptr: 0 param (T), 1 grad (T), 2 momentum buffer (float, may be null), 3 master (float, may
// be null), 4 compensation (T, may be null).
template <class T>
__global__ void __launch_bounds__(kOptThreads) sgd_kernel(TensorChunks<5> m, SgdArgs a) {
  if (a.found_inf && *a.found_inf != 0.0f) return;
  using A = dacc_t<T>;
  const auto [k, begin, end] = chunk_of(m);
  T* p = static_cast<T*>(m.ptr[0][k]);
  const T* g = static_cast<const T*>(m.ptr[1][k]);
  float* buf = static_cast<float*>(m.ptr[2][k]);
  float* master = static_cast<float*>(m.ptr[3][k]);
  T* comp = static_cast<T*>(m.ptr[4][k]);
  const int64_t step_count = *m.step[k];
  const bool first = step_count == 0;
  const A lr = A(a.lr.get()), mom = A(a.momentum), damp = A(a.damp), wd = A(a.wd);
  unsigned n_stalled = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const A w0 = master ? A(master[i]) : convert<A>(p[i]);
    A d = convert<A>(g[i]) + wd * w0;
    if (buf) {
      const A v = first ? d : mom * A(buf[i]) + damp * d;
      buf[i] = float(v);
      d = a.nesterov ? d + mom * v : v;
    }
    const A step = lr * d;
    const A w = w0 - step;
    A stored;
    if (master) {
      master[i] = float(w);
      p[i] = convert<T>(w);
      stored = A(master[i]);
    } else {
      stored = store_value(p, comp, i, w0, w, -step, a.round, m.id[k], step_count);
    }
    n_stalled += step != A(0) && stored == w0 ? 1u : 0u;
  }
  if (is_dev_half_v<T> && a.round.stalled) add_stalled(a.round.stalled + m.list_index[k], n_stalled);
}

struct AdamArgs {
  DeviceScalar lr;
  const float* found_inf;
  double beta1, beta2, eps, weight_decay;
  bool decoupled;
  RoundArgs round;
};

// ptr: 0 param, 1 grad, 2 exp_avg (float), 3 exp_avg_sq (float), 4 master (float, may be
// null), 5 compensation (T, may be null).
template <class T>
__global__ void __launch_bounds__(kOptThreads) adam_kernel(TensorChunks<6> m, AdamArgs a) {
  if (a.found_inf && *a.found_inf != 0.0f) return;
  using A = dacc_t<T>;
  const auto [k, begin, end] = chunk_of(m);
  T* p = static_cast<T*>(m.ptr[0][k]);
  const T* g = static_cast<const T*>(m.ptr[1][k]);
  float* m1 = static_cast<float*>(m.ptr[2][k]);
  float* m2 = static_cast<float*>(m.ptr[3][k]);
  float* mw = static_cast<float*>(m.ptr[4][k]);
  T* comp = static_cast<T*>(m.ptr[5][k]);
  // The bias corrections at this parameter's 1-based step, in double as on the CPU.
  const int64_t step_count = *m.step[k];
  const double t = double(step_count + 1);
  const double lr = a.lr.get();
  // Folded into eps and the step size as on the CPU (backend.h's AdamParams).
  const double bc1 = 1 - pow(a.beta1, t), bc2_sqrt = sqrt(1 - pow(a.beta2, t));
  const A b1 = A(a.beta1), b2 = A(a.beta2), eps = A(a.eps * bc2_sqrt);
  const A omb1 = A(1 - a.beta1), omb2 = A(1 - a.beta2);
  const A step_size = A(lr * bc2_sqrt / bc1);
  const A decay = a.decoupled ? A(1 - lr * a.weight_decay) : A(1);
  const A decay_m1 = a.decoupled ? A(-lr * a.weight_decay) : A(0);  // the decay's share of the update
  const A l2 = a.decoupled ? A(0) : A(a.weight_decay);
  unsigned n_stalled = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const A w0 = mw ? A(mw[i]) : convert<A>(p[i]);
    const A gi = convert<A>(g[i]) + l2 * w0;
    const A av = b1 * A(m1[i]) + omb1 * gi;
    const A vv = b2 * A(m2[i]) + omb2 * gi * gi;
    m1[i] = float(av);
    m2[i] = float(vv);
    const A step = step_size * av / (sqrt(vv) + eps);
    const A w = w0 * decay - step;
    A stored;
    if (mw) {
      mw[i] = float(w);
      p[i] = convert<T>(w);
      stored = A(mw[i]);
    } else {
      stored = store_value(p, comp, i, w0, w, w0 * decay_m1 - step, a.round, m.id[k], step_count);
    }
    n_stalled += (step != A(0) || (decay_m1 != A(0) && w0 != A(0))) && stored == w0 ? 1u : 0u;
  }
  if (is_dev_half_v<T> && a.round.stalled) add_stalled(a.round.stalled + m.list_index[k], n_stalled);
}

// Advances every listed step counter, unless the step was skipped. Runs after the update
// on the same stream, so the update read the old counts.
struct StepCounters {
  int64_t* step[kMaxTensors];
  int n;
};
__global__ void advance_steps(StepCounters s, const float* found_inf) {
  if (found_inf && *found_inf != 0.0f) return;
  const int i = int(threadIdx.x);
  if (i < s.n) ++*s.step[i];
}

void check_lists(const OptimizerLists& l, const char* op, bool two_moments) {
  l.check(op, two_moments);
  for (size_t k = 0; k < l.params.size(); ++k) {
    AG_CHECK(l.params[k].device().is_cuda() && l.params[k].device() == l.params[0].device(), op,
             "parameters must share one CUDA device, got ", l.params[k].device(), " and ", l.params[0].device());
    AG_CHECK(l.params[k].is_contiguous() && l.grads[k].is_contiguous() && l.grads[k].dtype() == l.params[k].dtype(),
             op, "parameter ", k, " and its gradient must be contiguous and of one dtype");
    AG_CHECK(l.steps[k].dtype() == kInt64 && l.steps[k].numel() == 1, op, "step counter ", k,
             " must be an int64 tensor of one element");
  }
}

template <class T>
T* ptr_or_null(const TensorList& list, size_t k) {
  return list.empty() || !list[k].defined() ? nullptr : static_cast<T*>(list[k].raw_data());
}

void advance_all(const OptimizerLists& l, const float* found_inf, cudaStream_t stream, const char* op, int dev) {
  StepCounters s{};
  for (size_t k = 0; k < l.steps.size(); ++k) {
    s.step[s.n++] = static_cast<int64_t*>(l.steps[k].raw_data());
    if (s.n == kMaxTensors || k + 1 == l.steps.size()) {
      launch(advance_steps, 1, kMaxTensors, 0, stream, s, found_inf);
      check_launch(op, dev);
      s.n = 0;
    }
  }
}

// Indices of the parameters of each dtype (a group normally has one).
std::vector<std::pair<DType, std::vector<size_t>>> by_dtype(const TensorList& params) {
  std::vector<std::pair<DType, std::vector<size_t>>> groups;
  for (size_t k = 0; k < params.size(); ++k) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == params[k].dtype(); });
    if (it == groups.end()) groups.push_back({params[k].dtype(), {k}});
    else it->second.push_back(k);
  }
  return groups;
}

}  // namespace

namespace {

// One fused step: for the parameters of each dtype, packs of chunks go to
// launch.template operator()<D>(meta, blocks); pointer d of parameter k comes from
// ptr(k, d). The step counters advance afterwards unless found_inf says the step was skipped.
template <int kDepth, class Ptr, class Launch>
void fused_step(const OptimizerLists& l, const char* op, const float* found_inf, const Ptr& ptr,
                const Launch& launch) {
  const Device dev = l.params[0].device();
  const cudaStream_t stream = stream_of(dev);
  // named, not a structured binding: the lambdas below capture them (clang before 16 refuses)
  for (const auto& group : by_dtype(l.params)) {
    const DType dtype = group.first;
    const std::vector<size_t>& idx = group.second;
    std::vector<int64_t> numels, ids;
    std::vector<int64_t*> steps;
    std::vector<int> list_index;  // the parameter's index in l: its stalled slot
    for (size_t k : idx) {
      numels.push_back(l.params[k].numel());
      steps.push_back(static_cast<int64_t*>(l.steps[k].raw_data()));
      ids.push_back(k < l.ids.size() ? l.ids[k] : 0);
      list_index.push_back(int(k));
    }
    dispatch_floating(dtype, op, [&]<class T>() {
      for_each_pack<kDepth>(
          idx.size(), numels, steps, ids, list_index, [&](size_t j, int d) -> void* { return ptr(idx[j], d); },
          [&](const TensorChunks<kDepth>& m, int blocks) {
            launch.template operator()<dev_t<T>>(m, blocks, stream);
            check_launch(op, dev.index);
          });
    });
  }
  advance_all(l, found_inf, stream, op, dev.index);
}

}  // namespace

void CudaBackend::sgd_step(const OptimizerLists& l, const SgdParams& s) {
  constexpr const char* kOp = "SGD";
  check_lists(l, kOp, false);
  if (l.params.empty()) return;
  DeviceGuard guard(l.params[0].device().index, kOp);
  const SgdArgs a{device_scalar(l.lr.tensor, l.lr.value, kOp, "the learning rate"),
                  flag_ptr(l.found_inf, kOp),
                  s.momentum,
                  1 - s.dampening,
                  s.weight_decay,
                  s.nesterov,
                  round_args(l)};
  fused_step<5>(
      l, kOp, a.found_inf,
      [&](size_t k, int d) -> void* {
        switch (d) {
          case 0: return l.params[k].raw_data();
          case 1: return l.grads[k].raw_data();
          case 2: return ptr_or_null<float>(l.buf1, k);
          case 3: return ptr_or_null<float>(l.masters, k);
          default: return ptr_or_null<void>(l.comps, k);
        }
      },
      [&]<class D>(const TensorChunks<5>& m, int blocks, cudaStream_t stream) {
        launch(sgd_kernel<D>, blocks, kOptThreads, 0, stream, m, a);
      });
}

void CudaBackend::adam_step(const OptimizerLists& l, const AdamParams& s) {
  const char* op = s.decoupled ? "AdamW" : "Adam";
  check_lists(l, op, true);
  if (l.params.empty()) return;
  DeviceGuard guard(l.params[0].device().index, op);
  const AdamArgs a{device_scalar(l.lr.tensor, l.lr.value, op, "the learning rate"),
                   flag_ptr(l.found_inf, op),
                   s.beta1,
                   s.beta2,
                   s.eps,
                   s.weight_decay,
                   s.decoupled,
                   round_args(l)};
  fused_step<6>(
      l, op, a.found_inf,
      [&](size_t k, int d) -> void* {
        switch (d) {
          case 0: return l.params[k].raw_data();
          case 1: return l.grads[k].raw_data();
          case 2: return l.buf1[k].raw_data();
          case 3: return l.buf2[k].raw_data();
          case 4: return ptr_or_null<float>(l.masters, k);
          default: return ptr_or_null<void>(l.comps, k);
        }
      },
      [&]<class D>(const TensorChunks<6>& m, int blocks, cudaStream_t stream) {
        launch(adam_kernel<D>, blocks, kOptThreads, 0, stream, m, a);
      });
}

// ---- grad scaler ---------------------------------------------------------------------------
namespace {

// Scales each element in place (computed in A) and raises *found_inf when the value before
// scaling was inf or NaN. Threads that see one write the same 1.0f: a benign race.
template <class T>
__global__ void __launch_bounds__(kOptThreads)
    scale_check_kernel(TensorChunks<1> m, DeviceScalar factor, float* found_inf) {
  using A = dacc_t<T>;
  const auto [k, begin, end] = chunk_of(m);
  T* x = static_cast<T*>(m.ptr[0][k]);
  const A f = A(factor.get());
  bool bad = false;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const A v = convert<A>(x[i]);
    bad |= !isfinite(v);
    x[i] = convert<T>(v * f);
  }
  if (found_inf && __syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1.0f;
}

// Per-chunk sums of squares in the accumulation type, into partial[chunk] as double.
template <class T>
__global__ void __launch_bounds__(kOptThreads) square_sum_kernel(TensorChunks<1> m, double* partial, int first_block) {
  using A = dacc_t<T>;
  const auto [k, begin, end] = chunk_of(m);
  const T* x = static_cast<const T*>(m.ptr[0][k]);
  A acc = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const A v = convert<A>(x[i]);
    acc += v * v;
  }
  // Block reduction in a fixed order: warp shuffles, then the warps' sums.
  __shared__ A warp_sums[kOptThreads / 32];
  for (int o = 16; o > 0; o /= 2) acc += __shfl_down_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    A total = 0;
    for (int w = 0; w < int(blockDim.x) / 32; ++w) total += warp_sums[w];
    partial[first_block + int(blockIdx.x)] = double(total);
  }
}

// out = float(sum of partial[0..n)) in double, in index order (deterministic).
__global__ void __launch_bounds__(kOptThreads) sum_partials(const double* partial, int n, float* out) {
  __shared__ double s[kOptThreads];
  double acc = 0;
  for (int i = int(threadIdx.x); i < n; i += blockDim.x) acc += partial[i];
  s[threadIdx.x] = acc;
  __syncthreads();
  for (int w = int(blockDim.x) / 2; w > 0; w /= 2) {
    if (int(threadIdx.x) < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = float(s[0]);
}

__global__ void update_scale_kernel(double* scale, int64_t* tracker, const float* found_inf, ScaleUpdateRule r) {
  double s = *scale;
  if (*found_inf != 0.0f) {
    s = fmax(s * r.backoff_factor, r.min_scale);
    *tracker = 0;
  } else if (++*tracker >= r.growth_interval) {
    // The scale is applied as a float32 tensor, so growth beyond float32 is refused.
    const double grown = s * r.growth_factor;
    if (grown <= 3.4028234663852886e38) s = fmin(grown, r.max_scale);
    *tracker = 0;
  }
  *scale = s;
}

void check_list(const TensorList& xs, const char* op) {
  for (const Tensor& x : xs) {
    AG_CHECK(x.is_contiguous(), op, "expected contiguous tensors, got strides ", x.strides());
    AG_CHECK(x.is_floating_point(), op, "expected floating tensors, got ", dtype_name(x.dtype()));
    AG_CHECK(x.device().is_cuda() && x.device() == xs[0].device(), op, "tensors must share one CUDA device, got ",
             x.device(), " and ", xs[0].device());
  }
}

// Runs f.template operator()<T>(idx) for the indices of each dtype's tensors in xs.
template <class F>
void for_each_dtype(const TensorList& xs, const char* op, const F& f) {
  for (const auto& group : by_dtype(xs)) {
    const std::vector<size_t>& idx = group.second;  // captured: not a structured binding (clang before 16)
    dispatch_floating(group.first, op, [&]<class T>() { f.template operator()<T>(idx); });
  }
}

}  // namespace

void CudaBackend::scale_and_check(const TensorList& xs, const Tensor& factor, const Tensor& found_inf) {
  constexpr const char* kOp = "scale_and_check";
  const float* flag = flag_ptr(found_inf, kOp);
  check_list(xs, kOp);
  if (xs.empty()) return;
  const Device dev = xs[0].device();
  DeviceGuard guard(dev.index, kOp);
  const cudaStream_t stream = stream_of(dev);
  AG_CHECK(factor.defined(), kOp, "factor must be a float32 or float64 tensor of one element");
  const DeviceScalar f = device_scalar(factor, 0, kOp, "factor");
  for_each_dtype(xs, kOp, [&]<class T>(const std::vector<size_t>& idx) {
    std::vector<int64_t> numels;
    for (size_t k : idx) numels.push_back(xs[k].numel());
    for_each_pack<1>(
        idx.size(), numels, {}, {}, {}, [&](size_t j, int) -> void* { return xs[idx[j]].raw_data(); },
        [&](const TensorChunks<1>& m, int blocks) {
          launch(scale_check_kernel<dev_t<T>>, blocks, kOptThreads, 0, stream, m, f, const_cast<float*>(flag));
          check_launch(kOp, dev.index);
        });
  });
}

void CudaBackend::sum_of_squares(const TensorList& xs, const Tensor& out) {
  constexpr const char* kOp = "sum_of_squares";
  AG_CHECK(out.dtype() == kFloat32 && out.numel() == 1 && out.device().is_cuda(), kOp,
           "out must be a float32 tensor of one element on the device");
  check_list(xs, kOp);
  AG_CHECK(xs.empty() || xs[0].device() == out.device(), kOp, "out must be on the tensors' device, got ",
           out.device(), " and ", xs.empty() ? out.device() : xs[0].device());
  const Device dev = out.device();
  DeviceGuard guard(dev.index, kOp);
  const cudaStream_t stream = stream_of(dev);
  int64_t chunks = 0;
  for (const Tensor& x : xs) chunks += (x.numel() + kChunk - 1) / kChunk;
  // One double per chunk, summed in chunk order by one block: deterministic.
  const Tensor partial = empty({std::max<int64_t>(chunks, 1)}, TensorOptions(kFloat64).device(dev));
  double* part = static_cast<double*>(partial.raw_data());
  int filled = 0;
  for_each_dtype(xs, kOp, [&]<class T>(const std::vector<size_t>& idx) {
    std::vector<int64_t> numels;
    for (size_t k : idx) numels.push_back(xs[k].numel());
    for_each_pack<1>(
        idx.size(), numels, {}, {}, {}, [&](size_t j, int) -> void* { return xs[idx[j]].raw_data(); },
        [&](const TensorChunks<1>& m, int blocks) {
          launch(square_sum_kernel<dev_t<T>>, blocks, kOptThreads, 0, stream, m, part, filled);
          check_launch(kOp, dev.index);
          filled += blocks;
        });
  });
  launch(sum_partials, 1, kOptThreads, 0, stream, part, filled, static_cast<float*>(out.raw_data()));
  check_launch(kOp, dev.index);
}

void CudaBackend::update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                               const ScaleUpdateRule& rule) {
  constexpr const char* kOp = "update_scale";
  AG_CHECK(scale.dtype() == kFloat64 && scale.numel() == 1, kOp, "scale must be a float64 tensor of one element");
  AG_CHECK(growth_tracker.dtype() == kInt64 && growth_tracker.numel() == 1, kOp,
           "growth_tracker must be an int64 tensor of one element");
  AG_CHECK(found_inf.defined(), kOp, "found_inf must be a float32 tensor of one element");
  const float* flag = flag_ptr(found_inf, kOp);
  const Device dev = scale.device();
  DeviceGuard guard(dev.index, kOp);
  launch(update_scale_kernel, 1, 1, 0, stream_of(dev),
         static_cast<double*>(scale.raw_data()), static_cast<int64_t*>(growth_tracker.raw_data()), flag, rule);
  check_launch(kOp, dev.index);
}

}  // namespace ampgrad::cuda
