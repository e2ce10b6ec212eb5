#include <atomic>
#include <string>

#include "ampgrad/device.h"
#include "ampgrad/dtype.h"
#include "ampgrad/error.h"
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

namespace {
// One row per activation: its name, forward op, gradient op, and what the gradient reads.
struct ActivationRow {
  const char* name;
  UnaryOp op;
  BinaryOp backward;
  bool reads_output;
};
const ActivationRow& activation_row(Activation a) {
  static const ActivationRow rows[] = {
      {"none", UnaryOp::Neg, BinaryOp::Add, false},  // never asked for its ops
      {"relu", UnaryOp::Relu, BinaryOp::ReluBackward, true},
      {"gelu", UnaryOp::GeluErf, BinaryOp::GeluErfBackward, false},
      {"gelu_tanh", UnaryOp::GeluTanh, BinaryOp::GeluTanhBackward, false},
  };
  const auto i = size_t(a);
  AG_CHECK(i < sizeof rows / sizeof rows[0], "activation", "unknown activation ", int(i));
  return rows[i];
}
}  // namespace

const char* activation_name(Activation a) { return activation_row(a).name; }
UnaryOp activation_op(Activation a) {
  AG_CHECK(a != Activation::None, "activation", "the activation 'none' has no op");
  return activation_row(a).op;
}
BinaryOp activation_backward_op(Activation a) {
  AG_CHECK(a != Activation::None, "activation", "the activation 'none' has no gradient op");
  return activation_row(a).backward;
}
bool activation_grad_reads_output(Activation a) { return activation_row(a).reads_output; }

}  // namespace ampgrad
