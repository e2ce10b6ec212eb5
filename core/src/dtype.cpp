#include <atomic>
#include <string>

#include "ampgrad/device.h"
#include "ampgrad/dtype.h"
#include "ampgrad/op_kinds.h"

namespace ampgrad {

namespace {
std::atomic<DType> g_default_dtype{kFloat32};
}

void set_default_dtype(DType dt) {
  AG_CHECK(is_floating(dt), "set_default_dtype", "the default dtype must be floating, got ",
           dtype_name(dt));
  g_default_dtype.store(dt);
}
DType get_default_dtype() { return g_default_dtype.load(); }

DType parse_dtype(std::string_view name) {
#define AG_DTYPE_PARSE(e, t, n, f, r) \
  if (name == n) return DType::e;
  AG_FORALL_DTYPES(AG_DTYPE_PARSE)
#undef AG_DTYPE_PARSE
  if (name == "float" || name == "fp32") return kFloat32;
  if (name == "double" || name == "fp64") return kFloat64;
  if (name == "half" || name == "fp16") return kFloat16;
  if (name == "bf16") return kBFloat16;
  if (name == "long") return kInt64;
  if (name == "int") return kInt32;
  AG_ERROR("parse_dtype", "unknown dtype '", name, "'");
}

const char* device_type_name(DeviceType t) { return t == DeviceType::CPU ? "cpu" : "cuda"; }

Device::Device(std::string_view spec) {
  const auto colon = spec.find(':');
  const std::string_view kind = spec.substr(0, colon);
  if (kind == "cpu") {
    type = DeviceType::CPU;
  } else if (kind == "cuda") {
    type = DeviceType::CUDA;
  } else {
    AG_ERROR("device", "unknown device '", spec, "' (expected cpu, cuda or cuda:N)");
  }
  if (colon != std::string_view::npos) {
    const std::string idx(spec.substr(colon + 1));
    AG_CHECK(!idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos &&
                 idx.size() < 6,
             "device", "bad device index in '", spec, "'");
    index = std::stoi(idx);
    AG_CHECK(type == DeviceType::CUDA || index == 0, "device", "cpu has only index 0, got '",
             spec, "'");
  }
}

std::string Device::str() const {
  std::string s = device_type_name(type);
  if (type == DeviceType::CUDA) {
    s += ':';  // two appends: GCC 12 warns falsely on ":" + std::to_string (its bug 105651)
    s += std::to_string(index);
  }
  return s;
}

#define AG_NAME_CASE(NAME) \
  case E::NAME: return #NAME;
const char* op_name(UnaryOp op) {
  using E = UnaryOp;
  switch (op) { AG_UNARY_OPS(AG_NAME_CASE) }
  return "?";
}
const char* op_name(BinaryOp op) {
  using E = BinaryOp;
  switch (op) { AG_BINARY_OPS(AG_NAME_CASE) }
  return "?";
}
const char* op_name(CompareOp op) {
  using E = CompareOp;
  switch (op) { AG_COMPARE_OPS(AG_NAME_CASE) }
  return "?";
}
const char* op_name(ReduceOp op) {
  using E = ReduceOp;
  switch (op) { AG_REDUCE_OPS(AG_NAME_CASE) }
  return "?";
}
#undef AG_NAME_CASE

}  // namespace ampgrad
