// Checked size arithmetic: every size, element count and byte count computed from user input
// goes through these, so that a huge shape is refused with an ag::Error naming the op and the
// sizes instead of wrapping to a small number (a tensor with a huge shape and no storage).
//
//   checked_mul(a, b, "eye", "n * m")      -> a * b, or "[eye] n * m overflows int64: a * b"
//   checked_numel(shape, "zeros")          -> the product, or "[zeros] the shape [..] has more
//                                             elements than int64 can hold"
//   checked_nbytes(numel, itemsize, "zeros") -> numel * itemsize as size_t, or an error
//
// The fast path is one overflow builtin per multiplication and no allocation; the message is
// built out of line, only when a check fails.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ampgrad/shape.h"

namespace ampgrad {

namespace detail {
[[noreturn]] void throw_mul_overflow(int64_t a, int64_t b, const char* op, const char* what);
[[noreturn]] void throw_add_overflow(int64_t a, int64_t b, const char* op, const char* what);
[[noreturn]] void throw_bad_shape(const Shape& shape, const char* op);
[[noreturn]] void throw_nbytes_overflow(int64_t numel, size_t itemsize, const char* op);
}  // namespace detail

/// a * b, or an ag::Error "[op] <what> overflows int64: a * b".
inline int64_t checked_mul(int64_t a, int64_t b, const char* op, const char* what = "size") {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) [[unlikely]]
    detail::throw_mul_overflow(a, b, op, what);
  return r;
}

/// a + b, or an ag::Error "[op] <what> overflows int64: a + b".
inline int64_t checked_add(int64_t a, int64_t b, const char* op, const char* what = "size") {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) [[unlikely]]
    detail::throw_add_overflow(a, b, op, what);
  return r;
}

/// Whether a tensor of this shape can exist: no negative size, and the product of the
/// nonzero sizes fits in int64 (so that the element count and every contiguous stride do).
inline bool shape_fits(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) return false;
    if (s != 0 && __builtin_mul_overflow(n, s, &n)) return false;
  }
  return true;
}

/// The element count of a shape given by the user, checked as shape_fits says; the error
/// names the op and the shape.
inline int64_t checked_numel(const Shape& shape, const char* op) {
  if (!shape_fits(shape)) [[unlikely]]
    detail::throw_bad_shape(shape, op);
  return shape.numel();
}

/// numel * itemsize as a byte count that fits both int64 and size_t, or an ag::Error.
inline size_t checked_nbytes(int64_t numel, size_t itemsize, const char* op) {
  int64_t r;
  if (numel < 0 || __builtin_mul_overflow(numel, itemsize, &r)) [[unlikely]]
    detail::throw_nbytes_overflow(numel, itemsize, op);
  if constexpr (sizeof(size_t) < sizeof(int64_t)) {
    if (uint64_t(r) > uint64_t(SIZE_MAX)) [[unlikely]]
      detail::throw_nbytes_overflow(numel, itemsize, op);
  }
  return size_t(r);
}

}  // namespace ampgrad
