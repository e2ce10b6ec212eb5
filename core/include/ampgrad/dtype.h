// dtypes: one X-macro table is the single definition of every dtype ampgrad knows.
//
// Each row gives the enum name, the C++ storage type, the printed name, whether the dtype
// is floating, and its rank inside its category (bool < integral < floating). The enum,
// dtype_name, itemsize, is_floating, the C++ type mapping, the promotion table and the
// dispatch helpers are all generated from it; adding a dtype is one row.
#pragma once

#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

#include "ampgrad/error.h"
#include "ampgrad/half.h"

//  _(Enum,    C++ type,            name,       floating, rank)
#define AG_FORALL_DTYPES(_)                              \
  _(Float32, float, "float32", true, 2)                  \
  _(Float64, double, "float64", true, 3)                 \
  _(Float16, ::ampgrad::Half, "float16", true, 1)        \
  _(BFloat16, ::ampgrad::BFloat16, "bfloat16", true, 1)  \
  _(Int64, int64_t, "int64", false, 3)                   \
  _(Int32, int32_t, "int32", false, 2)                   \
  _(UInt8, uint8_t, "uint8", false, 1)                   \
  _(Bool, bool, "bool", false, 0)

namespace ampgrad {

enum class DType : uint8_t {
#define AG_DTYPE_ENUM(e, t, n, f, r) e,
  AG_FORALL_DTYPES(AG_DTYPE_ENUM)
#undef AG_DTYPE_ENUM
};

#define AG_DTYPE_CONST(e, t, n, f, r) inline constexpr DType k##e = DType::e;
AG_FORALL_DTYPES(AG_DTYPE_CONST)
#undef AG_DTYPE_CONST

inline constexpr int kNumDTypes = 0
#define AG_DTYPE_COUNT(e, t, n, f, r) +1
    AG_FORALL_DTYPES(AG_DTYPE_COUNT);
#undef AG_DTYPE_COUNT

namespace detail {
struct DTypeInfo {
  const char* name;
  uint8_t itemsize;
  bool floating;
  int rank;
};
inline constexpr DTypeInfo kDTypeInfo[] = {
#define AG_DTYPE_INFO(e, t, n, f, r) {n, sizeof(t), f, r},
    AG_FORALL_DTYPES(AG_DTYPE_INFO)
#undef AG_DTYPE_INFO
};
}  // namespace detail

/// "float32", "bfloat16", ...
constexpr const char* dtype_name(DType dt) { return detail::kDTypeInfo[int(dt)].name; }
/// Bytes per element.
constexpr size_t itemsize(DType dt) { return detail::kDTypeInfo[int(dt)].itemsize; }
constexpr bool is_floating(DType dt) { return detail::kDTypeInfo[int(dt)].floating; }
/// float16 and bfloat16: stored in 16 bits, computed in float32. The dtype form of
/// is_float16_v (half.h), the one definition of "a 16-bit float".
constexpr bool is_reduced_floating(DType dt) {
  switch (dt) {
#define AG_DTYPE_REDUCED(e, t, n, f, r) \
  case DType::e: return is_float16_v<t>;
    AG_FORALL_DTYPES(AG_DTYPE_REDUCED)
#undef AG_DTYPE_REDUCED
  }
  return false;
}
constexpr bool is_integral(DType dt, bool include_bool = false) {
  return !is_floating(dt) && (include_bool || dt != kBool);
}

/// The dtype two tensor operands compute in, following PyTorch: within a category the
/// higher rank wins; integral with floating gives the floating dtype; float16 with
/// bfloat16 gives float32 (neither holds the other).
constexpr DType promote_types(DType a, DType b) {
  if (a == b) return a;
  const auto& ia = detail::kDTypeInfo[int(a)];
  const auto& ib = detail::kDTypeInfo[int(b)];
  if (ia.floating != ib.floating) return ia.floating ? a : b;
  if (ia.floating && ia.rank == ib.rank) return kFloat32;  // float16 with bfloat16
  if (!ia.floating && (a == kBool || b == kBool)) return a == kBool ? b : a;
  return ia.rank >= ib.rank ? a : b;
}

inline std::ostream& operator<<(std::ostream& os, DType dt) { return os << dtype_name(dt); }

/// Parses "float32", "float", "fp32", "bf16", ... Throws ag::Error for unknown names.
DType parse_dtype(std::string_view name);

/// The default floating dtype (float32 unless changed) used by factories and by
/// promotion of integral tensors with floating C++ scalars.
void set_default_dtype(DType dt);
DType get_default_dtype();

/// C++ type <-> dtype.
template <DType D>
struct CppType;
#define AG_DTYPE_CPP(e, t, n, f, r) \
  template <>                       \
  struct CppType<DType::e> {        \
    using type = t;                 \
  };
AG_FORALL_DTYPES(AG_DTYPE_CPP)
#undef AG_DTYPE_CPP
template <DType D>
using cpp_type_t = typename CppType<D>::type;

template <class T>
inline constexpr DType dtype_of = [] {
#define AG_DTYPE_OF(e, t, n, f, r) \
  if constexpr (std::is_same_v<T, t>) return DType::e;
  AG_FORALL_DTYPES(AG_DTYPE_OF)
#undef AG_DTYPE_OF
}();

/// The type that arithmetic on T is carried out in: float for the 16-bit floats and
/// float32, double for float64 (reductions accumulate in it too).
template <class T>
using acc_type_t = std::conditional_t<std::is_same_v<T, double>, double,
                                      std::conditional_t<std::is_integral_v<T>, T, float>>;

/// Calls f.template operator()<T>() with T the C++ type of dt, for floating dtypes.
/// `op` names the caller in the error raised for any other dtype.
template <class F>
decltype(auto) dispatch_floating(DType dt, std::string_view op, F&& f) {
  switch (dt) {
    case kFloat32: return f.template operator()<float>();
    case kFloat64: return f.template operator()<double>();
    case kFloat16: return f.template operator()<Half>();
    case kBFloat16: return f.template operator()<BFloat16>();
    default: AG_ERROR(op, "expected a floating dtype, got ", dtype_name(dt));
  }
}

/// As dispatch_floating, for every dtype.
template <class F>
decltype(auto) dispatch_all(DType dt, std::string_view op, F&& f) {
  switch (dt) {
#define AG_DTYPE_CASE(e, t, n, fl, r) \
  case DType::e: return f.template operator()<t>();
    AG_FORALL_DTYPES(AG_DTYPE_CASE)
#undef AG_DTYPE_CASE
  }
  AG_ERROR(op, "unknown dtype ", int(dt));
}

}  // namespace ampgrad
