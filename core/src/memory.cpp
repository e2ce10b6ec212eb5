// Storage allocation and freeing, stream-ordered (ampgrad/stream.h), and the statistics of
// ampgrad/memory.h.
//
// A storage is allocated on its device's current stream and freed on that stream. One that
// record_stream marked as used on other streams is not freed at once: an event is recorded
// on each of those streams and the block is held until all of them have completed (the rule
// of PyTorch's caching allocator). Held blocks are checked when the device next allocates,
// at synchronize and at empty_cache. Like the stream registry, the held lists outlive static
// tensors.
#include <algorithm>
#include <atomic>
#include <mutex>

#include "ampgrad/backend.h"
#include "ampgrad/memory.h"
#include "stream_internal.h"

namespace ampgrad {
namespace {

// Counters per device type and index (indices beyond the last share its slot).
struct Counters {
  std::atomic<uint64_t> allocations{0}, frees{0}, bytes{0}, cache_hits{0}, peak{0}, deferred{0}, pending{0};
};
Counters g_counters[kNumDeviceTypes][detail::kMaxDeviceIndex];
int slot(Device d) { return std::clamp(d.index, 0, detail::kMaxDeviceIndex - 1); }
Counters& counters(Device d) { return g_counters[int(d.type)][slot(d)]; }

void note_allocation(Device d, size_t nbytes, bool from_cache) {
  Counters& c = counters(d);
  c.allocations.fetch_add(1, std::memory_order_relaxed);
  if (from_cache) c.cache_hits.fetch_add(1, std::memory_order_relaxed);
  const uint64_t now = c.bytes.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
  uint64_t peak = c.peak.load(std::memory_order_relaxed);
  while (now > peak && !c.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

// A freed block that waits for an event on each stream that used it.
struct HeldBlock {
  void* data;
  size_t nbytes;
  Backend* allocator;
  Stream stream;
  bool pinned;
  std::vector<std::pair<Stream, void*>> events;  // (stream recorded on, backend event)
};

struct HeldBlocks {
  std::mutex mu;
  std::vector<HeldBlock> blocks;
};

HeldBlocks& held_of(Device d) {
  static auto* table = new HeldBlocks[kNumDeviceTypes * detail::kMaxDeviceIndex];
  return table[int(d.type) * detail::kMaxDeviceIndex + slot(d)];
}

void release(Backend* allocator, void* data, size_t nbytes, Stream stream, bool pinned) noexcept {
  if (pinned) allocator->deallocate_pinned(data, nbytes);
  else allocator->deallocate(data, nbytes, detail::live_stream(stream));
}

void destroy_events(const HeldBlock& b) noexcept {
  for (const auto& [s, ev] : b.events) {
    try {
      backend(s.device(), "free").destroy_event(s.device().index, ev);
    } catch (...) {  // a failing device: leak the event
    }
  }
}

bool events_done(const HeldBlock& b) noexcept {
  try {
    for (const auto& [s, ev] : b.events)
      if (!backend(s.device(), "free").query_event(ev)) return false;
    return true;
  } catch (...) {  // a failing device: keep the block rather than reuse it too early
    return false;
  }
}

// Holds the storage's block until every other stream that used it is done with it.
void hold(const Storage& st) noexcept {
  HeldBlock b{st.data, st.nbytes, st.allocator, st.stream, st.pinned, {}};
  try {
    for (const Stream& use : st.stream_uses) {
      // A destroyed stream's work is ordered before its device's default stream.
      const Stream s = detail::live_stream(use);
      Backend& be = backend(s.device(), "free");
      b.events.emplace_back(s, be.create_event(s.device().index, false));
      be.record_event(b.events.back().second, s);
    }
  } catch (...) {  // a failing device cannot order the free; release the block now
    destroy_events(b);
    release(b.allocator, b.data, b.nbytes, b.stream, b.pinned);
    return;
  }
  Counters& c = counters(st.device);
  c.deferred.fetch_add(1, std::memory_order_relaxed);
  HeldBlocks& h = held_of(st.device);
  std::lock_guard<std::mutex> lock(h.mu);
  h.blocks.push_back(std::move(b));
  c.pending.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

void detail::process_pending_frees(Device d) noexcept {
  Counters& c = counters(d);
  if (c.pending.load(std::memory_order_relaxed) == 0) return;
  std::vector<HeldBlock> done;
  {
    HeldBlocks& h = held_of(d);
    std::lock_guard<std::mutex> lock(h.mu);
    auto keep = std::stable_partition(h.blocks.begin(), h.blocks.end(),
                                      [](const HeldBlock& b) { return !events_done(b); });
    done.assign(std::make_move_iterator(keep), std::make_move_iterator(h.blocks.end()));
    h.blocks.erase(keep, h.blocks.end());
    c.pending.fetch_sub(done.size(), std::memory_order_relaxed);
  }
  for (const HeldBlock& b : done) {
    destroy_events(b);
    release(b.allocator, b.data, b.nbytes, b.stream, b.pinned);
  }
}

Storage::~Storage() {
  if (allocator) {
    Counters& c = counters(device);
    c.frees.fetch_add(1, std::memory_order_relaxed);
    c.bytes.fetch_sub(nbytes, std::memory_order_relaxed);
    if (stream_uses.empty()) release(allocator, data, nbytes, stream, pinned);
    else hold(*this);
  } else if (deleter) {
    deleter(data);
  }
}

std::shared_ptr<Storage> allocate_storage(size_t nbytes, Device device) {
  detail::check_device_index(device, "allocate");
  Backend& be = backend(device, "allocate");
  detail::process_pending_frees(device);
  auto s = std::make_shared<Storage>();
  s->stream = current_stream(device);
  const Backend::Allocation a = be.allocate(nbytes, s->stream);
  s->data = a.data;
  s->nbytes = nbytes;
  s->device = device;
  s->allocator = &be;
  note_allocation(device, nbytes, a.from_cache);
  return s;
}

std::shared_ptr<Storage> allocate_pinned_storage(size_t nbytes) {
  Backend* accelerator = accelerator_backend();
  Backend& be = accelerator ? *accelerator : cpu_backend();
  const Device cpu(kCPU);
  detail::process_pending_frees(cpu);
  auto s = std::make_shared<Storage>();
  s->stream = current_stream(cpu);
  const Backend::Allocation a = be.allocate_pinned(nbytes);
  s->data = a.data;
  s->nbytes = nbytes;
  s->device = cpu;
  s->allocator = &be;
  s->pinned = true;
  note_allocation(cpu, nbytes, a.from_cache);
  return s;
}

void record_stream(const Tensor& t, Stream s) {
  AG_CHECK(t.defined(), "record_stream", "the tensor is undefined");
  Storage& st = *t.impl_ptr()->storage;
  detail::check_stream(s, "record_stream");
  AG_CHECK(s.device() == st.device || (st.pinned && st.device.is_cpu()), "record_stream", "a tensor on ",
           st.device, " cannot be used on ", s, " (only pinned CPU memory is read by other devices' streams)");
  // Memory ampgrad did not allocate (from_blob) is freed by its owner: nothing to hold.
  if (!st.allocator || s == st.stream) return;
  if (std::find(st.stream_uses.begin(), st.stream_uses.end(), s) == st.stream_uses.end())
    st.stream_uses.push_back(s);
}

MemoryStats memory_stats(Device device) {
  const Counters& c = counters(device);
  MemoryStats m;
  m.cache_hits = c.cache_hits.load(std::memory_order_relaxed);  // before allocations, which never trails it
  m.allocations = c.allocations.load(std::memory_order_relaxed);
  m.system_allocations = m.allocations - m.cache_hits;
  m.frees = c.frees.load(std::memory_order_relaxed);
  m.bytes_in_use = c.bytes.load(std::memory_order_relaxed);
  m.peak_bytes_in_use = c.peak.load(std::memory_order_relaxed);
  m.deferred_frees = c.deferred.load(std::memory_order_relaxed);
  m.pending_frees = c.pending.load(std::memory_order_relaxed);
  try {
    Backend* be = device.is_cpu() ? &cpu_backend() : accelerator_backend();
    if (be && be->device_type() == device.type) m.bytes_cached = be->cached_bytes(device.index);
  } catch (...) {  // statistics never throw; a failing device reports nothing cached
  }
  return m;
}

void reset_peak_memory_stats(Device device) {
  Counters& c = counters(device);
  c.peak.store(c.bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

void empty_cache(Device device) {
  Backend& be = backend(device, "empty_cache");
  detail::process_pending_frees(device);
  be.empty_cache(device.index);
}

cuda::MemoryStats cuda::memory_stats(int device) {
  const ampgrad::MemoryStats m = ampgrad::memory_stats(Device(kCUDA, device));
  return {m.bytes_in_use, m.bytes_in_use + m.bytes_cached, m.peak_bytes_in_use};
}

void cuda::reset_peak_memory_stats(int device) { ampgrad::reset_peak_memory_stats(Device(kCUDA, device)); }

}  // namespace ampgrad
