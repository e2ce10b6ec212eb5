// Indexing kernels of the CUDA backend: index_select and gather (embedding and nll_loss
// forward), index_add and scatter_add (their gradients), with the CPU's semantics
// (kernels/cpu/index.cpp): indices are int64, in [0, n), as in PyTorch.
//
// The host has not seen a CUDA tensor's indices, so the kernels check them: an index
// outside [0, n), a negative one too, is never used for an address; the kernel reports it
// into the device's error slot (report_index_error; the host raises it at its next sync,
// backend.cu) and skips the element (index_select/gather leave that output element
// unwritten, index_add/scatter_add add nothing for it).
//
// Every tensor may be strided: each kernel walks a StridedLayout built here over the
// shape it iterates, where the indexed dim gets stride 0 in the indexed tensor, and adds
// index * (that dim's stride) itself.
//
// index_add and scatter_add are deterministic and use no atomics; they add in the CPU's
// order, so their results are bit for bit the CPU's. Each thread owns a set of
// destination elements that no other thread writes:
//  * index_add: one thread per destination "line" (every coordinate but dim, i.e. one
//    (outer, inner) column) walks the whole index list in order. The embedding gradient
//    runs here, which the issue wants deterministic by default. The cost: only
//    outer * inner threads (embedding: the embedding width) each doing index.numel()
//    sequential read-add-writes; a sort-based segmented sum would parallelise over the
//    index list too, and is the upgrade when this shows up in profiles.
//  * scatter_add: one thread per line of the index tensor along dim (every coordinate but
//    dim) walks that line in order; lines write disjoint output lines. nll_loss's
//    gradient has lines of length 1, so this is fully parallel there.
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/cuda_backend.h"

namespace ampgrad::cuda {
namespace {

using kernels::kMaxLoopDims;
using kernels::StridedLayout;

// A tensor's sizes and byte strides, with a 0-dim tensor seen as one element of rank 1.
struct Dims {
  std::vector<int64_t> sizes, strides;
};
Dims dims_of(const Tensor& t) {
  Dims g;
  if (t.dim() == 0) return {{1}, {0}};
  for (int64_t d = 0; d < t.dim(); ++d) {
    g.sizes.push_back(t.sizes()[size_t(d)]);
    g.strides.push_back(t.strides()[size_t(d)] * int64_t(t.itemsize()));
  }
  return g;
}

// The coalesced layout of N operands over `sizes` (row-major) with the given byte strides.
template <int N>
StridedLayout<N> layout_of(const std::vector<int64_t>& sizes, const std::array<std::vector<int64_t>, N>& strides,
                           const std::array<char*, N>& base, const char* op) {
  std::array<const int64_t*, N> s;
  for (int k = 0; k < N; ++k) s[size_t(k)] = strides[size_t(k)].data();
  return kernels::make_layout<N>(sizes.data(), int(sizes.size()), s, base, op);
}

// The kernels dereference every operand on out's device: an index left on the host (the
// frontend range-checks a CPU index and passes it on) would be an illegal address there.
void check_operands(const char* op, const Tensor& out, const Tensor& x, const Tensor& index) {
  AG_CHECK(index.dtype() == kInt64, op, "index must be int64, got ", dtype_name(index.dtype()));
  AG_CHECK(x.device() == out.device() && index.device() == out.device(), op, "expected tensors on one device, got ",
           x.device(), ", ", index.device(), " and ", out.device());
}

__device__ __forceinline__ bool in_range(int64_t j, int64_t n) { return j >= 0 && j < n; }

// out[i] = x[... index[i] ...]: operands of L are out, x (stride 0 along the indexed dim)
// and the index (as broadcast to out's shape); x_dim_stride is x's byte stride along dim.
// E is an unsigned type of the element's size: elements are moved, not converted.
template <class E>
__global__ void take_kernel(StridedLayout<3> L, int64_t n, int64_t x_dim_stride, DeviceError* err, int op) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < L.numel; i += stride) {
    int64_t off[3];
    offsets_of(L, i, off);
    const int64_t j = *reinterpret_cast<const int64_t*>(L.base[2] + off[2]);
    if (!in_range(j, n)) {
      report_index_error(err, op, j, n);
      continue;
    }
    *reinterpret_cast<E*>(L.base[0] + off[0]) =
        *reinterpret_cast<const E*>(L.base[1] + off[1] + j * x_dim_stride);
  }
}

// index_add: operands of L are out and src over out's shape with dim of size 1 (one
// thread per destination line); idx has m entries idx_stride apart.
template <class D>
__global__ void index_add_kernel(StridedLayout<2> L, const int64_t* idx, int64_t idx_stride, int64_t m,
                                 int64_t n, int64_t out_dim_stride, int64_t src_dim_stride, DeviceError* err) {
  using A = dacc_t<D>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < L.numel; t += stride) {
    int64_t off[2];
    offsets_of(L, t, off);
    char* const o = L.base[0] + off[0];
    const char* const s = L.base[1] + off[1];
    for (int64_t i = 0; i < m; ++i) {
      const int64_t j = idx[i * idx_stride];
      if (!in_range(j, n)) {
        report_index_error(err, kErrIndexAdd, j, n);
        continue;
      }
      D* const d = reinterpret_cast<D*>(o + j * out_dim_stride);
      const D v = *reinterpret_cast<const D*>(s + i * src_dim_stride);
      *d = convert<D>(convert<A>(*d) + convert<A>(v));
    }
  }
}

// scatter_add: operands of L are out, src and index over index's shape with dim of size 1
// (one thread per index line); each line has len entries along dim.
template <class D>
__global__ void scatter_add_kernel(StridedLayout<3> L, int64_t len, int64_t n, int64_t out_dim_stride,
                                   int64_t src_dim_stride, int64_t idx_dim_stride, DeviceError* err) {
  using A = dacc_t<D>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < L.numel; t += stride) {
    int64_t off[3];
    offsets_of(L, t, off);
    char* const o = L.base[0] + off[0];
    const char* const s = L.base[1] + off[1];
    const char* const ip = L.base[2] + off[2];
    for (int64_t k = 0; k < len; ++k) {
      const int64_t j = *reinterpret_cast<const int64_t*>(ip + k * idx_dim_stride);
      if (!in_range(j, n)) {
        report_index_error(err, kErrScatterAdd, j, n);
        continue;
      }
      D* const d = reinterpret_cast<D*>(o + j * out_dim_stride);
      const D v = *reinterpret_cast<const D*>(s + k * src_dim_stride);
      *d = convert<D>(convert<A>(*d) + convert<A>(v));
    }
  }
}

// index_select and gather: out over `shape` (out's), x with dim's stride zeroed, and the
// index with byte strides idx_strides over that shape.
void launch_take(const char* op, int err_op, const Tensor& x, int64_t dim, const Tensor& index,
                 std::vector<int64_t> idx_strides, const Tensor& out) {
  check_operands(op, out, x, index);
  const Dims o = dims_of(out);
  Dims xd = dims_of(x);
  const size_t sd = size_t(x.dim() == 0 ? 0 : dim);
  const int64_t n = xd.sizes[sd];
  const int64_t x_dim_stride = xd.strides[sd];
  xd.strides[sd] = 0;
  const StridedLayout<3> L =
      layout_of<3>(o.sizes, {o.strides, xd.strides, std::move(idx_strides)},
                   {static_cast<char*>(out.raw_data()), static_cast<char*>(x.raw_data()),
                    static_cast<char*>(index.raw_data())},
                   op);
  if (L.numel == 0) return;
  const int dev = out.device().index;
  DeviceGuard guard(dev, op);
  DeviceError* const err = error_slot(dev);
  const cudaStream_t stream = stream_of(out.device());
  const unsigned blocks = blocks_for(L.numel);
  switch (x.itemsize()) {
    case 1: launch(take_kernel<uint8_t>, blocks, kThreads, 0, stream, L, n, x_dim_stride, err, err_op); break;
    case 2: launch(take_kernel<uint16_t>, blocks, kThreads, 0, stream, L, n, x_dim_stride, err, err_op); break;
    case 4: launch(take_kernel<uint32_t>, blocks, kThreads, 0, stream, L, n, x_dim_stride, err, err_op); break;
    case 8: launch(take_kernel<uint64_t>, blocks, kThreads, 0, stream, L, n, x_dim_stride, err, err_op); break;
    default: AG_ERROR(op, "unsupported element size ", x.itemsize());
  }
  check_launch(op, dev);
}

}  // namespace

void CudaBackend::index_select(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) {
  // The 1-D index seen over out's shape: its stride along dim, 0 elsewhere.
  std::vector<int64_t> idx_strides(size_t(out.dim() == 0 ? 1 : out.dim()), 0);
  if (out.dim() > 0) idx_strides[size_t(dim)] = (index.dim() == 0 ? 1 : index.strides()[0]) * int64_t(sizeof(int64_t));
  launch_take(op::index_select, kErrIndexSelect, x, dim, index, std::move(idx_strides), out);
}

void CudaBackend::gather(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) {
  launch_take(op::gather, kErrGather, x, dim, index, dims_of(index).strides, out);
}

void CudaBackend::index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  check_operands("index_add", out, src, index);
  dispatch_floating(out.dtype(), "index_add", [&]<class T>() {
    using D = dev_t<T>;
    const Dims o = dims_of(out), s = dims_of(src);
    const size_t sd = size_t(out.dim() == 0 ? 0 : dim);
    const int64_t n = o.sizes[sd], m = index.numel();
    std::vector<int64_t> lines = o.sizes;
    lines[sd] = 1;
    const StridedLayout<2> L = layout_of<2>(
        lines, {o.strides, s.strides},
        {static_cast<char*>(out.raw_data()), static_cast<char*>(src.raw_data())}, "index_add");
    if (L.numel == 0 || m == 0) return;
    const int dev = out.device().index;
    DeviceGuard guard(dev, "index_add");
    DeviceError* const err = error_slot(dev);
    const int64_t idx_stride = index.dim() == 0 ? 1 : index.strides()[0];
    launch(index_add_kernel<D>, blocks_for(L.numel), kThreads, 0, stream_of(out.device()),
           L, static_cast<const int64_t*>(index.raw_data()), idx_stride, m, n, o.strides[sd], s.strides[sd], err);
    check_launch("index_add", dev);
  });
}

void CudaBackend::scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  check_operands("scatter_add", out, src, index);
  dispatch_floating(out.dtype(), "scatter_add", [&]<class T>() {
    using D = dev_t<T>;
    const Dims o = dims_of(out), s = dims_of(src), ix = dims_of(index);
    const size_t sd = size_t(index.dim() == 0 ? 0 : dim);
    const int64_t n = o.sizes[sd], len = ix.sizes[sd];
    std::vector<int64_t> lines = ix.sizes;
    lines[sd] = 1;
    const StridedLayout<3> L = layout_of<3>(
        lines, {o.strides, s.strides, ix.strides},
        {static_cast<char*>(out.raw_data()), static_cast<char*>(src.raw_data()),
         static_cast<char*>(index.raw_data())},
        "scatter_add");
    if (L.numel == 0 || len == 0) return;
    const int dev = out.device().index;
    DeviceGuard guard(dev, "scatter_add");
    DeviceError* const err = error_slot(dev);
    launch(scatter_add_kernel<D>, blocks_for(L.numel), kThreads, 0, stream_of(out.device()),
           L, len, n, o.strides[sd], s.strides[sd], ix.strides[sd], err);
    check_launch("scatter_add", dev);
  });
}

}  // namespace ampgrad::cuda
