// Cast shadows (ampgrad/cast_shadow.h).
#include "ampgrad/cast_shadow.h"

#include <memory>
#include <mutex>

#include "ampgrad/autograd.h"
#include "ampgrad/factories.h"

namespace ampgrad::detail {
namespace {

std::mutex& shadow_mutex() {
  static std::mutex m;
  return m;
}

// A fresh handle on c's memory: what autocast gives out (and records autograd on) is never
// the handle the parameter keeps.
Tensor alias(const Tensor& c) {
  const TensorImpl& i = *c.unsafe_impl();
  return Tensor(std::make_shared<TensorImpl>(i.storage, i.sizes, i.strides, i.offset, i.dtype));
}

AutogradMeta* meta_of(const Tensor& t) { return t.defined() ? t.unsafe_impl()->autograd.get() : nullptr; }

// The shadow now holds the rounding of t's present value: valid until t changes.
void mark_valid(AutogradMeta& m, const Tensor& t) {
  m.cast_shadow_version = t.version();
  m.cast_shadow_of = t.unsafe_impl()->storage;
  m.cast_shadow_valid = true;
}

}  // namespace

Tensor shadow_cast(const Tensor& t, DType dtype) {
  const std::lock_guard<std::mutex> lock(shadow_mutex());
  const AutogradMeta* m = meta_of(t);
  // The version alone is not enough: a parameter given new storage (a dtype round trip)
  // restarts its count.
  if (!m || !m->cast_shadow_valid || !m->cast_shadow.defined() || m->cast_shadow.dtype() != dtype ||
      m->cast_shadow_version != t.version() || m->cast_shadow_of.lock() != t.unsafe_impl()->storage)
    return Tensor();
  return alias(m->cast_shadow);
}

void keep_cast(const Tensor& t, const Tensor& cast) {
  if (!GradMode::is_enabled() || !cast.is_contiguous() || cast.storage_offset() != 0) return;
  const std::lock_guard<std::mutex> lock(shadow_mutex());
  AutogradMeta& m = t.unsafe_impl()->meta();
  m.cast_shadow = alias(cast);
  // Valid at once for the value it was cast from: a second forward before any step
  // (gradient accumulation) reads it instead of casting again.
  mark_valid(m, t);
}

Tensor shadow_buffer(const Tensor& t) {
  const std::lock_guard<std::mutex> lock(shadow_mutex());
  AutogradMeta* m = meta_of(t);
  if (!m || !m->cast_shadow.defined()) return Tensor();
  m->cast_shadow_valid = false;
  const Tensor& c = m->cast_shadow;
  const bool sole = c.impl_ptr().use_count() == 1 && c.unsafe_impl()->storage.use_count() == 1;
  if (!sole || c.sizes() != t.sizes() || c.device() != t.device())
    m->cast_shadow = empty(t.sizes().vec(), TensorOptions(c.dtype()).device(t.device()));
  return m->cast_shadow;
}

void shadow_written(const Tensor& t) {
  const std::lock_guard<std::mutex> lock(shadow_mutex());
  AutogradMeta* m = meta_of(t);
  if (!m || !m->cast_shadow.defined()) return;
  mark_valid(*m, t);
}

}  // namespace ampgrad::detail
