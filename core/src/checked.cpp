// The error paths of checked size arithmetic (ampgrad/checked.h), out of line so that the
// checks inline to one overflow builtin and a branch.
#include "ampgrad/checked.h"

#include "ampgrad/error.h"

namespace ampgrad::detail {

void throw_mul_overflow(int64_t a, int64_t b, const char* op, const char* what) {
  AG_ERROR(op, what, " overflows int64: ", a, " * ", b);
}

void throw_add_overflow(int64_t a, int64_t b, const char* op, const char* what) {
  AG_ERROR(op, what, " overflows int64: ", a, " + ", b);
}

void throw_bad_shape(const Shape& shape, const char* op) {
  for (int64_t s : shape) AG_CHECK(s >= 0, op, "negative dimension ", s, " in shape ", shape);
  bool has_zero = false;
  for (int64_t s : shape) has_zero |= s == 0;
  if (!has_zero) AG_ERROR(op, "the shape ", shape, " has more elements than int64 can hold");
  // A zero size makes the product 0, but the other sizes still multiply into the strides.
  AG_ERROR(op, "the shape ", shape, " is too large: the product of its nonzero sizes overflows int64");
}

void throw_nbytes_overflow(int64_t numel, size_t itemsize, const char* op) {
  AG_CHECK(numel >= 0, op, "negative element count ", numel);
  AG_ERROR(op, "a tensor of ", numel, " elements of ", itemsize,
           " bytes each needs more bytes than int64 can hold");
}

}  // namespace ampgrad::detail
