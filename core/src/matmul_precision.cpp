// The process-wide float32 product precision (ampgrad/matmul_precision.h): one atomic,
// read by the backends at each matmul, linear and convolution.
#include "ampgrad/matmul_precision.h"

#include <atomic>

#include "ampgrad/error.h"

namespace ampgrad {
namespace {
std::atomic<Float32MatmulPrecision> g_precision{Float32MatmulPrecision::Highest};
}  // namespace

void set_float32_matmul_precision(const std::string& precision) {
  Float32MatmulPrecision p;
  if (precision == "highest") p = Float32MatmulPrecision::Highest;
  else if (precision == "high") p = Float32MatmulPrecision::High;
  else if (precision == "medium") p = Float32MatmulPrecision::Medium;
  else
    AG_ERROR("set_float32_matmul_precision", "expected \"highest\", \"high\" or \"medium\", got \"", precision,
             "\"");
  g_precision.store(p, std::memory_order_relaxed);
}

const char* float32_matmul_precision_name(Float32MatmulPrecision p) {
  switch (p) {
    case Float32MatmulPrecision::High: return "high";
    case Float32MatmulPrecision::Medium: return "medium";
    case Float32MatmulPrecision::Highest: break;
  }
  return "highest";
}

std::string get_float32_matmul_precision() { return float32_matmul_precision_name(float32_matmul_precision()); }

Float32MatmulPrecision float32_matmul_precision() { return g_precision.load(std::memory_order_relaxed); }

}  // namespace ampgrad
