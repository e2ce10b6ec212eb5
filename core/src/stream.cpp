// Streams and events (ampgrad/stream.h): the registry of stream ids and their native
// handles, each thread's current streams, and Event over the backend's event entries.
//
// The registry outlives static tensors (storages freed at exit still look up their stream),
// so it is allocated once and never destroyed, like the CPU block cache.
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "ampgrad/backend.h"
#include "stream_internal.h"

namespace ampgrad {
namespace {

struct DeviceStreams {
  std::mutex mu;
  int64_t next_id = 1;
  std::unordered_map<int64_t, void*> live;  // created, not destroyed: id -> native handle
};

DeviceStreams& streams_of(Device d) {
  static auto* table = new DeviceStreams[kNumDeviceTypes * detail::kMaxDeviceIndex];
  return table[int(d.type) * detail::kMaxDeviceIndex + d.index];
}

// The calling thread's current stream id per device; 0 is the default stream.
thread_local int64_t t_current[kNumDeviceTypes][detail::kMaxDeviceIndex] = {};

}  // namespace

void detail::check_device_index(Device d, const char* op) {
  AG_CHECK(d.index >= 0 && d.index < kMaxDeviceIndex, op, "device ", d, " is beyond the ",
           kMaxDeviceIndex, " devices per type that have streams");
}

void detail::check_stream(Stream s, const char* op) {
  check_device_index(s.device(), op);
  if (s.is_default()) return;
  DeviceStreams& ds = streams_of(s.device());
  std::lock_guard<std::mutex> lock(ds.mu);
  AG_CHECK(s.id() > 0 && s.id() < ds.next_id, op, s, " was never created (create_stream makes streams)");
  AG_CHECK(ds.live.count(s.id()) != 0, op, s, " was destroyed");
}

Stream detail::live_stream(Stream s) noexcept {
  if (s.is_default() || s.device().index < 0 || s.device().index >= kMaxDeviceIndex) return s;
  DeviceStreams& ds = streams_of(s.device());
  std::lock_guard<std::mutex> lock(ds.mu);
  return ds.live.count(s.id()) ? s : Stream(s.device(), 0);
}

void* stream_handle(Stream s) {
  if (s.is_default() || s.device().index < 0 || s.device().index >= detail::kMaxDeviceIndex) return nullptr;
  DeviceStreams& ds = streams_of(s.device());
  std::lock_guard<std::mutex> lock(ds.mu);
  auto it = ds.live.find(s.id());
  return it == ds.live.end() ? nullptr : it->second;
}

// ---- streams -------------------------------------------------------------------------------

std::string Stream::str() const {
  std::ostringstream os;
  os << device_ << " stream " << id_;
  return os.str();
}

void Stream::synchronize() const {
  detail::check_stream(*this, "Stream::synchronize");
  Backend& be = backend(device_, "Stream::synchronize");
  detail::note_host_sync("Stream::synchronize");
  be.synchronize_stream(*this);
}

bool Stream::query() const {
  detail::check_stream(*this, "Stream::query");
  return backend(device_, "Stream::query").query_stream(*this);
}

Stream default_stream(Device device) {
  detail::check_device_index(device, "default_stream");
  return Stream(device, 0);
}

Stream current_stream(Device device) {
  detail::check_device_index(device, "current_stream");
  return Stream(device, t_current[int(device.type)][device.index]);
}

void set_current_stream(Stream s) {
  detail::check_stream(s, "set_current_stream");
  t_current[int(s.device().type)][s.device().index] = s.id();
}

Stream create_stream(Device device) {
  detail::check_device_index(device, "create_stream");
  void* handle = backend(device, "create_stream").create_stream(device.index);
  DeviceStreams& ds = streams_of(device);
  std::lock_guard<std::mutex> lock(ds.mu);
  const int64_t id = ds.next_id++;
  ds.live.emplace(id, handle);
  return Stream(device, id);
}

void destroy_stream(Stream s) {
  AG_CHECK(!s.is_default(), "destroy_stream", "the default stream of ", s.device(), " cannot be destroyed");
  detail::check_stream(s, "destroy_stream");
  AG_CHECK(current_stream(s.device()) != s, "destroy_stream", s, " is the current stream of this thread");
  const Device d = s.device();
  Backend& be = backend(d, "destroy_stream");
  {
    // The default stream waits for the stream's work, so that later frees of storages that
    // remember it, which go to the default stream, come after that work.
    Event done(d, false);
    done.record(s);
    done.wait(Stream(d, 0));
  }
  void* handle = nullptr;
  {
    DeviceStreams& ds = streams_of(d);
    std::lock_guard<std::mutex> lock(ds.mu);
    auto it = ds.live.find(s.id());
    AG_CHECK(it != ds.live.end(), "destroy_stream", s, " was destroyed");
    handle = it->second;
    ds.live.erase(it);
  }
  be.destroy_stream(s, handle);
}

void synchronize(Device device) {
  detail::check_device_index(device, "synchronize");
  Backend& be = backend(device, "synchronize");
  detail::note_host_sync("synchronize");
  be.synchronize_device(device.index);
  detail::process_pending_frees(device);
}

StreamGuard::StreamGuard(Stream s) : original_(current_stream(s.device())) { set_current_stream(s); }

StreamGuard::~StreamGuard() {
  t_current[int(original_.device().type)][original_.device().index] = original_.id();
}

// ---- events --------------------------------------------------------------------------------

Event::Event(Device device, bool enable_timing) : device_(device), timing_(enable_timing) {
  detail::check_device_index(device, "Event");
}

Event::~Event() { release(); }

Event::Event(Event&& o) noexcept : device_(o.device_), timing_(o.timing_), handle_(o.handle_) {
  o.handle_ = nullptr;
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    release();
    device_ = o.device_;
    timing_ = o.timing_;
    handle_ = o.handle_;
    o.handle_ = nullptr;
  }
  return *this;
}

void Event::release() noexcept {
  if (!handle_) return;
  try {
    backend(device_, "Event").destroy_event(device_.index, handle_);
  } catch (...) {  // a failing device: leak the event rather than throw from a destructor
  }
  handle_ = nullptr;
}

void Event::record() { record(current_stream(device_)); }

void Event::record(Stream s) {
  AG_CHECK(s.device() == device_, "Event::record", "an event of ", device_, " cannot record ", s);
  detail::check_stream(s, "Event::record");
  Backend& be = backend(device_, "Event::record");
  if (!handle_) handle_ = be.create_event(device_.index, timing_);
  be.record_event(handle_, s);
}

void Event::wait() const { wait(current_stream(device_)); }

void Event::wait(Stream s) const {
  AG_CHECK(s.device() == device_, "Event::wait", "an event of ", device_, " cannot make ", s, " wait");
  detail::check_stream(s, "Event::wait");
  if (handle_) backend(device_, "Event::wait").stream_wait_event(s, handle_);
}

void Event::synchronize() const {
  Backend& be = backend(device_, "Event::synchronize");
  detail::note_host_sync("Event::synchronize");
  if (handle_) be.synchronize_event(handle_);
}

bool Event::query() const {
  return handle_ == nullptr || backend(device_, "Event::query").query_event(handle_);
}

double Event::elapsed_time(const Event& end) const {
  AG_CHECK(handle_ != nullptr, "Event::elapsed_time", "the start event was never recorded");
  AG_CHECK(end.handle_ != nullptr, "Event::elapsed_time", "the end event was never recorded");
  AG_CHECK(timing_, "Event::elapsed_time", "the start event was made without timing");
  AG_CHECK(end.timing_, "Event::elapsed_time", "the end event was made without timing");
  AG_CHECK(device_ == end.device_, "Event::elapsed_time", "the start event is on ", device_,
           " and the end event on ", end.device_);
  return backend(device_, "Event::elapsed_time").event_elapsed_ms(handle_, end.handle_);
}

}  // namespace ampgrad
