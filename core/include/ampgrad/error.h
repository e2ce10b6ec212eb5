// ampgrad errors.
//
// Every user error throws ag::Error (a std::runtime_error) whose message starts with the
// op's name in brackets and names the offending shapes, dtypes or devices, e.g.
//   [matmul] cannot multiply shapes [2, 3] and [4, 5]: 3 != 4
// AG_CHECK(cond, "op", parts...) builds such a message from any streamable parts, only
// when the check fails, so checks cost one branch on the hot path.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ampgrad {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  /// The message without its leading "[op] ", to restate the error under another op.
  std::string message() const {
    const std::string_view m = what();
    const size_t end = m.find("] ");
    return std::string(!m.empty() && m[0] == '[' && end != std::string_view::npos ? m.substr(end + 2) : m);
  }
};

namespace detail {

inline void stream_part(std::ostream& os, const std::vector<int64_t>& v) {
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
}
template <class T>
inline void stream_part(std::ostream& os, const T& v) {
  os << v;
}

template <class... Parts>
[[noreturn]] inline void throw_error(std::string_view op, const Parts&... parts) {
  std::ostringstream os;
  os << '[' << op << "] ";
  (stream_part(os, parts), ...);
  throw Error(os.str());
}

}  // namespace detail
}  // namespace ampgrad

#define AG_CHECK(cond, op, ...)                                  \
  do {                                                           \
    if (!(cond)) [[unlikely]]                                    \
      ::ampgrad::detail::throw_error((op), __VA_ARGS__);         \
  } while (0)

#define AG_ERROR(op, ...) ::ampgrad::detail::throw_error((op), __VA_ARGS__)
