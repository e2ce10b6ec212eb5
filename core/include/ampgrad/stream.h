// Streams and events: the order in which a device runs work, and how the host and other
// streams wait for it.
//
// A Stream is a queue of work on one device, named by (device, id); id 0 is the device's
// default stream and create_stream makes more. Each thread has a current stream per device
// (the default one until a StreamGuard sets another); ops, allocations and copies on a
// device queue their work on its current stream. Work on one stream runs in order; work on
// two streams may overlap unless an Event orders it:
//
//   ag::Stream side = ag::create_stream(ag::kCUDA);
//   ag::Event ready(ag::kCUDA);
//   {
//     ag::StreamGuard g(side);
//     x = pinned_batch.to(ag::kCUDA, /*non_blocking=*/true);   // queued on `side`
//     ready.record();                                          // on `side`
//   }
//   ready.wait();                                    // the current stream waits, the host does not
//   ag::record_stream(x, ag::current_stream(ag::kCUDA));   // x's memory is used here too
//
// Memory is stream-ordered: a storage remembers the stream it was allocated on, and its free
// is queued there. A storage also used on other streams must say so with record_stream;
// its free then waits until an event recorded on each of those streams has completed
// (PyTorch's caching-allocator rule), so its block is not handed out again too early.
//
// On the CPU every stream is synchronous (work is done when the call returns) and events
// complete when recorded, but streams are real objects with ids, and guards, events and the
// bookkeeping above all run, so code written for CUDA runs, and is tested, on the CPU.
//
// Host syncs (ampgrad/sync.h): synchronize(device), Stream::synchronize and
// Event::synchronize make the host wait, and each call counts one; creating, recording,
// waiting on and querying count none.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "ampgrad/device.h"

namespace ampgrad {

class Tensor;

/// A queue of work on a device: a (device, id) value, cheap to copy. Naming a stream does
/// not create it; create_stream does, and using an id that was never created, or was
/// destroyed, throws ag::Error naming it.
class Stream {
 public:
  /// The CPU's default stream.
  constexpr Stream() = default;
  constexpr Stream(Device device, int64_t id) : device_(device), id_(id) {}

  Device device() const { return device_; }
  /// 0 for the device's default stream; streams made by create_stream count from 1, per
  /// device, and an id is never reused.
  int64_t id() const { return id_; }
  bool is_default() const { return id_ == 0; }

  /// The host waits until all work queued on this stream so far has finished. A counted
  /// host sync ("Stream::synchronize").
  void synchronize() const;
  /// True when all work queued on this stream has finished. Never waits.
  bool query() const;

  /// "cpu stream 0", "cuda:1 stream 3".
  std::string str() const;
  friend constexpr bool operator==(const Stream& a, const Stream& b) {
    return a.device_ == b.device_ && a.id_ == b.id_;
  }

 private:
  Device device_;
  int64_t id_ = 0;
};

inline std::ostream& operator<<(std::ostream& os, const Stream& s) { return os << s.str(); }

/// The default stream of a device (id 0).
Stream default_stream(Device device);
/// The calling thread's current stream of a device; its default stream unless a StreamGuard
/// (or set_current_stream) chose another.
Stream current_stream(Device device);
/// Makes s the calling thread's current stream of s.device(). Prefer StreamGuard, which
/// restores the previous one.
void set_current_stream(Stream s);

/// A new stream on a device (CUDA: a non-blocking cudaStream_t, which does not wait for the
/// legacy default stream, so that work on it can overlap work there).
Stream create_stream(Device device);
/// Destroys a stream made by create_stream. It must not be the calling thread's current
/// stream. Its queued work still runs: the device's default stream is made to wait for it
/// (no host wait), and storages that remember the stream are later freed on the default
/// stream instead.
void destroy_stream(Stream s);

/// The host waits until all work on the device, on every stream, has finished. A counted
/// host sync ("synchronize"), on the CPU too.
void synchronize(Device device);

/// Marks t's storage as used on stream s as well as on the stream it was allocated on: when
/// the storage is freed, its block is held until an event recorded on s then has completed.
/// s must be on t's device, or, for a pinned CPU tensor (Tensor::pin_memory), on any device
/// (an asynchronous copy reads pinned memory from the device's stream). Not thread-safe
/// for one storage.
void record_stream(const Tensor& t, Stream s);

/// Sets the calling thread's current stream of s.device() to s for its scope, then restores
/// the one before it. Guards nest; each thread has its own current streams.
class StreamGuard {
 public:
  explicit StreamGuard(Stream s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;
  /// The stream that was current before this guard.
  Stream original_stream() const { return original_; }

 private:
  Stream original_;
};

/// A marker in a stream's work: record captures the work queued so far, and the host
/// (synchronize) or another stream (wait) can then wait for exactly that work. Move-only;
/// it holds a device event (CUDA: a cudaEvent_t) from its first record until destroyed.
class Event {
 public:
  /// An event for streams of `device`. With timing, elapsed_time works (the CPU reads a
  /// steady clock at record time; CUDA events without timing are cheaper).
  explicit Event(Device device = Device(kCPU), bool enable_timing = true);
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  Device device() const { return device_; }
  bool recorded() const { return handle_ != nullptr; }

  /// Captures the work queued so far on the current stream of the event's device, or on s,
  /// which must be on that device. Recording again moves the marker.
  void record();
  void record(Stream s);
  /// Makes the current stream of the event's device, or s, wait for the recorded work
  /// before it runs anything queued later. The host does not wait. Without a record there
  /// is nothing to wait for, and this does nothing.
  void wait() const;
  void wait(Stream s) const;
  /// The host waits until the recorded work has finished. A counted host sync
  /// ("Event::synchronize"), one per call, recorded or not.
  void synchronize() const;
  /// True when the recorded work has finished, or nothing was recorded. Never waits.
  bool query() const;
  /// Milliseconds from this event's record to end's. Both must be recorded, with timing, on
  /// one device, and (on CUDA) completed: synchronize `end` first.
  double elapsed_time(const Event& end) const;

 private:
  void release() noexcept;
  Device device_;
  bool timing_ = true;
  void* handle_ = nullptr;  // the backend's event, created on the first record
};

}  // namespace ampgrad
