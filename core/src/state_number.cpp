#include "ampgrad/state_number.h"

#include <cmath>
#include <sstream>

#include "ampgrad/error.h"

namespace ampgrad::detail {

namespace {

void one_element(const Tensor& t, const char* op, const std::string& key) {
  AG_CHECK(t.defined(), op, "'", key, "'", " is an undefined tensor");
  AG_CHECK(t.numel() == 1, op, "'", key, "'", " must hold one number, got shape ", t.sizes());
}

std::string show(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

}  // namespace

double state_double(const Tensor& t, const char* op, const std::string& key) {
  one_element(t, op, key);
  return t.item_double();
}

int64_t state_int(const Tensor& t, const char* op, const std::string& key, int64_t lo, int64_t hi) {
  one_element(t, op, key);
  int64_t v = 0;
  if (t.dtype() == kInt64) {  // exactly, not through a double
    const Tensor c = t.detach().to(kCPU).contiguous();
    v = *c.data_ptr<int64_t>();
  } else {
    const double d = t.item_double();
    // [-2^63, 2^63) is where a double converts to int64 without undefined behaviour.
    const bool ok = std::isfinite(d) && d == std::trunc(d) && d >= -0x1p63 && d < 0x1p63;
    AG_CHECK(ok, op, "'", key, "'", " must be an integer in [", lo, ", ", hi, "], got ", show(d),
             (t.is_floating_point() ? std::string(" (") + dtype_name(t.dtype()) + ")" : std::string()));
    v = int64_t(d);
  }
  AG_CHECK(v >= lo && v <= hi, op, "'", key, "'", " must be an integer in [", lo, ", ", hi, "], got ", v);
  return v;
}

uint64_t parse_u64(const std::string& text, const char* op, const std::string& key) {
  bool ok = !text.empty() && text.size() <= 20;
  uint64_t v = 0;
  for (char c : text) {
    ok = ok && c >= '0' && c <= '9';
    if (!ok) break;
    ok = !__builtin_mul_overflow(v, uint64_t(10), &v) && !__builtin_add_overflow(v, uint64_t(c - '0'), &v);
  }
  AG_CHECK(ok, op, "'", key, "'", " must be a decimal number in [0, 2^64), got \"", text.substr(0, 64),
           text.size() > 64 ? "...\"" : "\"");
  return v;
}

}  // namespace ampgrad::detail
