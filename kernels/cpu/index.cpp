// Indexing kernels: index_select / index_add (embedding and its gradient) and
// gather / scatter_add (nll_loss and its gradient). Indices are int64, contiguous and
// already checked by the frontend to lie in [0, n), as in PyTorch.
#include <cstring>

#include "cpu/cpu_backend.h"
#include "cpu/loops.h"
#include "cpu/parallel.h"
#include "cpu/vec.h"
#include "ampgrad/raw.h"

namespace ampgrad::cpu {
void CpuBackend::index_select(const Tensor& x0, int64_t dim, const Tensor& index, const Tensor& out) {
  const Tensor x = detail::contiguous_raw(x0);
  const Split3 in(x.sizes(), dim);
  const int64_t m = index.numel();
  const int64_t* idx = index.data_ptr<int64_t>();
  const size_t row = size_t(in.inner) * x.itemsize();
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  parallel_for(0, in.outer * m, std::max<int64_t>(1, 16384 / std::max<int64_t>(in.inner, 1)), [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const int64_t o = k / m, i = k % m;
      std::memcpy(dst + size_t(k) * row, src + size_t(o * in.n + idx[i]) * row, row);
    }
  });
}

void CpuBackend::index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src0) {
  const Tensor src = detail::contiguous_raw(src0);
  const Split3 o(out.sizes(), dim);
  const int64_t m = index.numel();
  const int64_t* idx = index.data_ptr<int64_t>();
  dispatch_floating(out.dtype(), "index_add", [&]<class T>() {
    using A = acc_type_t<T>;
    T* dst = static_cast<T*>(out.raw_data());
    const T* s = static_cast<const T*>(src.raw_data());
    // Threads split the inner columns, so no two threads add into one element.
    parallel_for(0, o.inner, 1024, [&](int64_t cb, int64_t ce) {
      for (int64_t a = 0; a < o.outer; ++a)
        for (int64_t i = 0; i < m; ++i) {
          T* d = dst + (a * o.n + idx[i]) * o.inner;
          const T* sr = s + (a * m + i) * o.inner;
          for (int64_t c = cb; c < ce; ++c) d[c] = cast<T>(A(d[c]) + A(sr[c]));
        }
    });
  });
}

void CpuBackend::gather(const Tensor& x0, int64_t dim, const Tensor& index, const Tensor& out) {
  const Tensor x = detail::contiguous_raw(x0);
  const Split3 xi(x.sizes(), dim);
  const Shape& isz = index.sizes();
  const Shape xst = x.strides();
  dispatch_all(x.dtype(), op::gather, [&]<class T>() {
    const T* src = static_cast<const T*>(x.raw_data());
    T* dst = static_cast<T*>(out.raw_data());
    const int64_t* idx = index.data_ptr<int64_t>();
    const int64_t nd = int64_t(isz.size());
    parallel_for(0, index.numel(), 16384, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        // multi-index of k in index's shape, mapped into x with dim replaced by idx[k]
        int64_t rem = k, off = 0;
        for (int64_t d = nd - 1; d >= 0; --d) {
          const int64_t c = rem % isz[size_t(d)];
          rem /= isz[size_t(d)];
          off += (d == dim ? idx[k] : c) * xst[size_t(d)];
        }
        dst[k] = src[off];
      }
    });
  });
}

void CpuBackend::scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src0) {
  const Tensor src = detail::contiguous_raw(src0);
  const Split3 oi(out.sizes(), dim);
  const Shape& isz = index.sizes();
  const Shape ost = out.strides();
  dispatch_floating(out.dtype(), "scatter_add", [&]<class T>() {
    using A = acc_type_t<T>;
    T* dst = static_cast<T*>(out.raw_data());
    const T* s = static_cast<const T*>(src.raw_data());
    const int64_t* idx = index.data_ptr<int64_t>();
    const int64_t nd = int64_t(isz.size());
    // Sequential: several index entries may target one element.
    for (int64_t k = 0; k < index.numel(); ++k) {
      int64_t rem = k, off = 0;
      for (int64_t d = nd - 1; d >= 0; --d) {
        const int64_t c = rem % isz[size_t(d)];
        rem /= isz[size_t(d)];
        off += (d == dim ? idx[k] : c) * ost[size_t(d)];
      }
      dst[off] = cast<T>(A(dst[off]) + A(s[k]));
    }
  });
}

}  // namespace ampgrad::cpu
