// Walking nested values: one helper that applies a function to every tensor in a value
// made of tensors, vectors, arrays, tuples, pairs, optionals and maps (keyed by anything),
// nested to any depth. Everything else (ints, strings, user structs) is passed through
// unchanged. The Lite module wrapper uses it to convert a forward's inputs and outputs
// whatever their shape, and to collect the dtypes in them.
//
//   std::map<std::string, ag::Tensor> out = model(x);
//   auto half = ag::apply_to_tensors(out, [](const ag::Tensor& t) { return t.to(ag::kFloat16); });
//   ag::for_each_tensor(out, [&](const ag::Tensor& t) { ... });
#pragma once

#include <array>
#include <map>
#include <optional>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ampgrad/tensor.h"

namespace ampgrad {

namespace detail {
template <class T> struct is_vector : std::false_type {};
template <class T, class A> struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T> struct is_array : std::false_type {};
template <class T, size_t N> struct is_array<std::array<T, N>> : std::true_type {};
template <class T> struct is_tuple_like : std::false_type {};
template <class... T> struct is_tuple_like<std::tuple<T...>> : std::true_type {};
template <class A, class B> struct is_tuple_like<std::pair<A, B>> : std::true_type {};
template <class T> struct is_optional : std::false_type {};
template <class T> struct is_optional<std::optional<T>> : std::true_type {};
template <class T> struct is_map : std::false_type {};
template <class K, class V, class C, class A> struct is_map<std::map<K, V, C, A>> : std::true_type {};
template <class K, class V, class H, class E, class A>
struct is_map<std::unordered_map<K, V, H, E, A>> : std::true_type {};
}  // namespace detail

/// A copy of `value` with every tensor t replaced by f(t) (f returns a Tensor). Undefined
/// tensors are passed to f too; containers keep their shape and keys.
template <class T, class F>
std::decay_t<T> apply_to_tensors(const T& value, F&& f) {
  using V = std::decay_t<T>;
  if constexpr (std::is_same_v<V, Tensor>) {
    return f(value);
  } else if constexpr (detail::is_vector<V>::value) {
    V out;
    out.reserve(value.size());
    for (const auto& e : value) out.push_back(apply_to_tensors(e, f));
    return out;
  } else if constexpr (detail::is_array<V>::value) {
    V out;
    for (size_t i = 0; i < value.size(); ++i) out[i] = apply_to_tensors(value[i], f);
    return out;
  } else if constexpr (detail::is_tuple_like<V>::value) {
    return std::apply([&](const auto&... e) { return V(apply_to_tensors(e, f)...); }, value);
  } else if constexpr (detail::is_optional<V>::value) {
    if (!value) return value;
    return V(apply_to_tensors(*value, f));
  } else if constexpr (detail::is_map<V>::value) {
    V out;
    for (const auto& [k, v] : value) out.emplace(k, apply_to_tensors(v, f));
    return out;
  } else {
    return value;
  }
}

/// Calls f(t) for every tensor in `value`, in order (vectors, tuples and ordered maps in
/// their order).
template <class T, class F>
void for_each_tensor(const T& value, F&& f) {
  apply_to_tensors(value, [&](const Tensor& t) {
    f(t);
    return t;
  });
}

}  // namespace ampgrad
