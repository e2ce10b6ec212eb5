// oneDNN plumbing shared by onednn_matmul.cpp and onednn_conv.cpp (only the oneDNN build
// includes it): one engine, a stream per thread, and a thread-safe cache of primitives.
//
// Creating a oneDNN primitive descriptor costs far more than running a small primitive,
// so each distinct problem (kind, dtype, shapes, strides, bias) creates its primitive once;
// a steady-state training step then creates none. An entry also keeps one memory object
// per argument whose data handle is swapped on each call, so the hot path allocates
// nothing; a second thread that finds the entry busy makes temporary memory objects
// instead of waiting (primitives themselves may execute concurrently). A PrimitivePlan is a
// primitive that runs on layouts it chose itself (oneDNN's blocked ones), with the reorders
// between those and the caller's layouts.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ampgrad/dtype.h"
#include "ampgrad/error.h"
#include "ampgrad/tensor.h"

namespace ampgrad::cpu::onednn {

using dnnl::memory;
using dt = dnnl::memory::data_type;

inline dnnl::engine& engine() {
  static dnnl::engine* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);  // outlives users at exit
  return *e;
}

// Streams are cheap; one per thread keeps concurrent callers independent.
inline dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

/// The oneDNN type of a dtype that oneDNN computes (float32, bfloat16, float16).
inline dt dnnl_type(DType d) {
  switch (d) {
    case kFloat32: return dt::f32;
    case kBFloat16: return dt::bf16;
    case kFloat16: return dt::f16;
    default: AG_ERROR("onednn", "no oneDNN type for ", dtype_name(d));
  }
}

/// Number of primitives held by all caches (the test hook cpu_primitive_cache_size).
inline std::atomic<size_t> g_cached_primitives{0};

/// The identity of a problem: a short list of integers.
struct Key {
  std::array<int64_t, 48> v{};
  uint32_t n = 0;
  Key& operator<<(int64_t x) {
    v[n++] = x;
    return *this;
  }
  bool operator==(const Key& o) const {
    return n == o.n && std::memcmp(v.data(), o.v.data(), n * sizeof(int64_t)) == 0;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const noexcept {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the values
    for (uint32_t i = 0; i < k.n; ++i) h = (h ^ uint64_t(k.v[i])) * 1099511628211ull;
    return size_t(h);
  }
};

/// A primitive with its argument list. `ok` is false when oneDNN has no fast
/// implementation for the problem (the caller then takes its fallback; remembering that
/// spares a second failed creation).
class Prim {
 public:
  static constexpr int kMaxArgs = 8;

  Prim() = default;  // not ok
  Prim(dnnl::primitive p, const std::vector<std::pair<int, memory::desc>>& args) : prim_(std::move(p)), ok_(true) {
    for (const auto& [id, md] : args) {
      ids_.push_back(id);
      mds_.push_back(md);
      mems_.emplace_back(md, engine(), static_cast<void*>(DNNL_MEMORY_NONE));
    }
  }
  bool ok() const { return ok_; }

  /// Runs the primitive on the given data pointers, in the order of the argument list.
  void execute(std::initializer_list<const void*> ptrs, const char* op) { execute(ptrs.begin(), op); }
  void execute(const void* const* ptrs, const char* op) {
    dnnl_exec_arg_t args[kMaxArgs];
    const size_t n = ids_.size();
    std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    std::vector<memory> temp;
    for (size_t i = 0; i < n; ++i) {
      void* p = const_cast<void*>(ptrs[i]);
      if (lock.owns_lock()) {
        mems_[i].set_data_handle(p);
        args[i] = {ids_[i], mems_[i].get()};
      } else {
        if (temp.empty()) temp.reserve(n);
        temp.emplace_back(mds_[i], engine(), p);
        args[i] = {ids_[i], temp.back().get()};
      }
    }
    const dnnl_status_t st = dnnl_primitive_execute(prim_.get(), stream().get(), int(n), args);
    AG_CHECK(st == dnnl_success, op, "oneDNN primitive execution failed with status ", int(st));
    stream().wait();
  }

 private:
  dnnl::primitive prim_;
  bool ok_ = false;
  std::vector<int> ids_;
  std::vector<memory::desc> mds_;
  std::vector<memory> mems_;
  std::mutex busy_;
};

/// True when oneDNN picked its slow reference implementation.
inline bool is_reference(const dnnl::primitive_desc_base& pd) {
  return std::strncmp(pd.impl_info_str(), "ref", 3) == 0;
}

/// One argument of a plan: the layout its primitive chose, and the reorder between it and
/// the caller's layout when they differ.
struct PrimitiveArg {
  memory::desc md;
  std::shared_ptr<Prim> reorder;  // null when the caller's memory is used directly
  bool output = false;
};

/// A primitive with reorders for the arguments it takes in a layout of its own choosing;
/// each call reorders through scratch tensors (from the allocator's pool, so a steady
/// state faults no pages).
struct PrimitivePlan {
  std::shared_ptr<Prim> prim;  // null: no fast kernel; the caller takes its fallback
  std::vector<PrimitiveArg> args;   // in the order the caller passes its pointers
  memory::desc dst_user;       // convolution forward plans: the layout of the caller's destination

  bool ok() const { return prim != nullptr; }

  void execute(std::initializer_list<const void*> user, const char* op) const {
    const void* ptrs[Prim::kMaxArgs] = {};
    Tensor scratch[Prim::kMaxArgs];
    size_t i = 0;
    for (const void* u : user) {
      const PrimitiveArg& a = args[i];
      ptrs[i] = u;
      if (a.reorder) {
        scratch[i] = make_tensor({int64_t(a.md.get_size())}, kUInt8, Device(kCPU));
        ptrs[i] = scratch[i].raw_data();
        if (!a.output) a.reorder->execute({u, ptrs[i]}, op);
      }
      ++i;
    }
    prim->execute(ptrs, op);
    i = 0;
    for (const void* u : user) {
      const PrimitiveArg& a = args[i];
      if (a.reorder && a.output) a.reorder->execute({ptrs[i], u}, op);
      ++i;
    }
  }
};

/// An argument as the caller holds it (user) and as the primitive descriptor chose it.
struct ArgSpec {
  int id;
  memory::desc user, chosen;
  bool output;
};

/// The plan of primitive P on descriptor pd; not ok when oneDNN offers only its reference kernel.
template <class P, class Pd>
std::shared_ptr<PrimitivePlan> make_plan(const Pd& pd, const std::vector<ArgSpec>& specs) {
  auto plan = std::make_shared<PrimitivePlan>();
  if (is_reference(pd)) return plan;
  std::vector<std::pair<int, memory::desc>> prim_args;
  for (const ArgSpec& s : specs) {
    PrimitiveArg a;
    a.md = s.chosen;
    a.output = s.output;
    if (s.chosen != s.user) {
      const memory::desc& from = s.output ? s.chosen : s.user;
      const memory::desc& to = s.output ? s.user : s.chosen;
      const dnnl::reorder::primitive_desc rpd(engine(), from, engine(), to);
      a.reorder = std::make_shared<Prim>(dnnl::reorder(rpd), std::vector<std::pair<int, memory::desc>>{
                                                                 {DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}});
    }
    plan->args.push_back(a);
    prim_args.push_back({s.id, s.chosen});
  }
  plan->prim = std::make_shared<Prim>(P(pd), prim_args);
  return plan;
}

/// Key -> entry (a PrimitivePlan, or another kind of prepared work), created on first use.
/// Bounded: past kCapacity entries the oldest is dropped (entries in use stay alive through
/// their shared_ptr).
template <class Entry>
class Cache {
 public:
  static constexpr size_t kCapacity = 4096;

  /// The entry for k, made by make() (returning std::shared_ptr<Entry>) if absent. make
  /// runs outside the lock; if two threads race, the first insertion wins.
  template <class Make>
  std::shared_ptr<Entry> get(const Key& k, const Make& make) {
    {
      std::shared_lock<std::shared_mutex> lock(mu_);
      auto it = map_.find(k);
      if (it != map_.end()) return it->second;
    }
    std::shared_ptr<Entry> made = make();
    std::unique_lock<std::shared_mutex> lock(mu_);
    auto [it, inserted] = map_.emplace(k, std::move(made));
    if (inserted) {
      order_.push_back(k);
      ++g_cached_primitives;
      if (map_.size() > kCapacity) {
        map_.erase(order_.front());
        order_.pop_front();
        --g_cached_primitives;
      }
    }
    return it->second;
  }

 private:
  std::shared_mutex mu_;
  std::unordered_map<Key, std::shared_ptr<Entry>, KeyHash> map_;
  std::deque<Key> order_;
};

/// Runs f(), turning oneDNN's exceptions into ag::Error naming op and, through
/// describe() (called only on error), the values of the problem that caused them.
template <class F, class D>
decltype(auto) guarded(const char* op, const F& f, const D& describe) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    AG_ERROR(op, "oneDNN error: ", e.what(), " (", describe(), ")");
  }
}

/// "[a, b, c]" for oneDNN dims, for error messages.
inline std::string dims_str(const memory::dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace ampgrad::cpu::onednn
