// Shape: the sizes or strides of a tensor.
//
// A small vector of int64_t that keeps up to 6 dims inline, so that making a tensor of an
// ordinary rank allocates nothing for its sizes and strides. It compares equal to a
// std::vector<int64_t> or a braced list, and converts to std::vector<int64_t>, so that code
// written for LibTorch's IntArrayRef reads the same.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <vector>

namespace ampgrad {

class Shape;
namespace detail {
/// Throws ag::Error "[op] the shape [..] has more elements than int64 can hold" (or names
/// its negative size); see ampgrad/checked.h.
[[noreturn]] void throw_bad_shape(const Shape& shape, const char* op);
}  // namespace detail

class Shape {
 public:
  static constexpr size_t kInline = 6;

  Shape() = default;
  explicit Shape(size_t n, int64_t value = 0) { resize(n, value); }
  Shape(std::initializer_list<int64_t> v) { assign(v.begin(), v.size()); }
  Shape(const std::vector<int64_t>& v) { assign(v.data(), v.size()); }  // NOLINT: implicit on purpose
  Shape(const int64_t* p, size_t n) { assign(p, n); }
  Shape(const Shape& o) { assign(o.data(), o.size()); }
  Shape(Shape&& o) noexcept { steal(o); }
  Shape& operator=(const Shape& o) {
    if (this != &o) assign(o.data(), o.size());
    return *this;
  }
  Shape& operator=(Shape&& o) noexcept {
    if (this != &o) steal(o);
    return *this;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t* data() { return heap_ ? heap_.get() : inline_; }
  const int64_t* data() const { return heap_ ? heap_.get() : inline_; }
  int64_t& operator[](size_t i) { return data()[i]; }
  int64_t operator[](size_t i) const { return data()[i]; }
  int64_t* begin() { return data(); }
  int64_t* end() { return data() + size_; }
  const int64_t* begin() const { return data(); }
  const int64_t* end() const { return data() + size_; }
  int64_t back() const { return data()[size_ - 1]; }
  int64_t front() const { return data()[0]; }

  void resize(size_t n, int64_t value = 0) {
    if (n > capacity()) grow(n);
    for (size_t i = size_; i < n; ++i) data()[i] = value;
    size_ = n;
  }
  void push_back(int64_t v) {
    if (size_ == capacity()) grow(std::max<size_t>(2 * capacity(), 8));
    data()[size_++] = v;
  }
  void insert(size_t pos, int64_t v) {
    push_back(0);
    int64_t* d = data();
    for (size_t i = size_ - 1; i > pos; --i) d[i] = d[i - 1];
    d[pos] = v;
  }
  void erase(size_t pos) {
    int64_t* d = data();
    for (size_t i = pos; i + 1 < size_; ++i) d[i] = d[i + 1];
    --size_;
  }
  void clear() { size_ = 0; }

  /// Product of the entries (1 for an empty shape). Throws ag::Error rather than wrap when
  /// the product overflows int64; a tensor's shape never does (make_tensor and the views
  /// check their shapes with checked_numel, which names the op).
  int64_t numel() const {
    int64_t n = 1;
    for (size_t i = 0; i < size_; ++i)
      if (__builtin_mul_overflow(n, data()[i], &n)) [[unlikely]]
        detail::throw_bad_shape(*this, "numel");
    return n;
  }
  std::vector<int64_t> vec() const { return std::vector<int64_t>(begin(), end()); }
  operator std::vector<int64_t>() const { return vec(); }  // NOLINT: implicit on purpose

  friend bool operator==(const Shape& a, const Shape& b) {
    return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator==(const Shape& a, const std::vector<int64_t>& b) {
    return a.size_ == b.size() && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator==(const std::vector<int64_t>& b, const Shape& a) { return a == b; }

 private:
  size_t capacity() const { return heap_ ? heap_cap_ : kInline; }
  void grow(size_t n) {
    std::unique_ptr<int64_t[]> p(new int64_t[n]);
    std::copy(data(), data() + size_, p.get());
    heap_ = std::move(p);
    heap_cap_ = n;
  }
  void assign(const int64_t* p, size_t n) {
    if (n > capacity()) {
      heap_.reset(new int64_t[n]);
      heap_cap_ = n;
    }
    std::copy(p, p + n, data());
    size_ = n;
  }
  void steal(Shape& o) {
    if (o.heap_) {
      heap_ = std::move(o.heap_);
      heap_cap_ = o.heap_cap_;
    } else {
      heap_.reset();
      std::copy(o.inline_, o.inline_ + o.size_, inline_);
    }
    size_ = o.size_;
    o.size_ = 0;
  }

  int64_t inline_[kInline];
  std::unique_ptr<int64_t[]> heap_;
  size_t heap_cap_ = 0;
  size_t size_ = 0;
};

inline std::ostream& operator<<(std::ostream& os, const Shape& s) {
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  return os << ']';
}

}  // namespace ampgrad
