// The execution model of the CUDA emulator: grids, blocks, threads and warps.
//
// A launch's blocks are handed out, one at a time, to a few OS threads (the one that runs
// the launch and a small pool). An OS thread runs a block to its end before it takes the
// next, so a block's static __shared__ variables (thread_local) are its own.
//
// Inside a block each CUDA thread is a fiber (fiber.h). The scheduler (Block::run) goes
// over the threads in the schedule's order (emu/control.h) and runs each until it blocks:
// at a barrier, at a warp collective whose partners have not all arrived, or at its end.
// So between two barriers thread 0 (or the last thread) runs everything first, and a
// missing barrier gives a wrong answer every time rather than now and then. A barrier that
// completes starts the next round from the beginning of the order; a collective completes
// when the last lane of its mask arrives, that lane going on and the others running in
// the next round. Misuse ends the launch with an error naming the barrier or collective
// (Block::fault_now), as would a hang or garbage on a GPU: a barrier reached after a
// thread of the block has exited or at another line, a lane outside its collective's
// mask, a lane the mask names that has exited or waits elsewhere.
//
// To follow a kernel in gdb: break on it, `print threadIdx` / `print blockIdx` tell which
// CUDA thread stops there, `call ampgrad::emu::print_block()` prints where each thread of
// the block waits; `next` over a __syncthreads() returns to the same thread once every
// thread of the block has reached it (docs/cuda-emulator.md).
#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fiber.h"
#include "internal.h"

// The built-in variables (emu/device.h): set by the scheduler before it resumes a fiber.
thread_local constinit uint3 threadIdx{};
thread_local constinit uint3 blockIdx{};
thread_local constinit dim3 blockDim{1, 1, 1};
thread_local constinit dim3 gridDim{1, 1, 1};

namespace ampgrad::emu {
namespace detail {
namespace {

/// Thrown inside a fiber to end its CUDA thread when the block is being aborted.
struct AbortThread {};

class Block;
class Worker;

// ---- settings -------------------------------------------------------------------------------------
std::atomic<int> g_schedule{-1};

Schedule schedule_from_env() {
  const char* s = std::getenv("AMPGRAD_CUDA_EMULATOR_SCHEDULE");
  if (!s || !*s) return Schedule::Alternate;
  const std::string v(s);
  if (v == "forward") return Schedule::Forward;
  if (v == "reverse") return Schedule::Reverse;
  if (v != "alternate")
    std::fprintf(stderr,
                 "ampgrad CUDA emulator: AMPGRAD_CUDA_EMULATOR_SCHEDULE=%s is not forward, reverse or "
                 "alternate; using alternate\n",
                 s);
  return Schedule::Alternate;
}

size_t fiber_stack_bytes() {
  static const size_t bytes = size_t(std::max(64L, env_long("AMPGRAD_CUDA_EMULATOR_STACK_KIB", 256))) * 1024;
  return bytes;
}

// ---- where a thread is ----------------------------------------------------------------------------
enum class State : uint8_t {
  Runnable,   // may run (not started, or released from a barrier or collective)
  Running,    // its fiber is the one running
  AtBarrier,  // waits at a __syncthreads
  AtWarp,     // waits at a warp collective
  Exited,     // its kernel function has returned
};

struct Thread {
  State state = State::Runnable;
  bool started = false;
  Site site{};                    // the barrier or collective it waits at
  Collective kind{};              // the collective it waits at
  unsigned long long result = 0;  // what its collective gives it
};

/// A warp collective that some lanes of `mask` have reached.
struct WarpOp {
  Collective kind;
  unsigned mask;
  Site site;
  int width;
  unsigned arrived = 0;
  unsigned long long value[32] = {};
  int arg[32] = {};
};

const char* collective_name(Collective k) {
  switch (k) {
    case Collective::SyncWarp: return "__syncwarp";
    case Collective::Shfl: return "__shfl_sync";
    case Collective::ShflUp: return "__shfl_up_sync";
    case Collective::ShflDown: return "__shfl_down_sync";
    case Collective::ShflXor: return "__shfl_xor_sync";
    case Collective::Ballot: return "__ballot_sync";
    case Collective::Any: return "__any_sync";
    case Collective::All: return "__all_sync";
    case Collective::MatchAny: return "__match_any_sync";
    case Collective::MatchAll: return "__match_all_sync";
    case Collective::ReduceAddU:
    case Collective::ReduceAddS: return "__reduce_add_sync";
    case Collective::ReduceMinU:
    case Collective::ReduceMinS: return "__reduce_min_sync";
    case Collective::ReduceMaxU:
    case Collective::ReduceMaxS: return "__reduce_max_sync";
    case Collective::ReduceAnd: return "__reduce_and_sync";
    case Collective::ReduceOr: return "__reduce_or_sync";
    case Collective::ReduceXor: return "__reduce_xor_sync";
  }
  return "a warp collective";
}

bool is_shuffle(Collective k) {
  return k == Collective::Shfl || k == Collective::ShflUp || k == Collective::ShflDown || k == Collective::ShflXor;
}

bool same_site(const Site& a, const Site& b) { return a.line == b.line && std::strcmp(a.file, b.file) == 0; }

std::string where(const Site& s) {
  const char* slash = std::strrchr(s.file, '/');
  return std::string(slash ? slash + 1 : s.file) + ":" + std::to_string(s.line);
}

std::string hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string triple(const uint3& v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "(%u,%u,%u)", v.x, v.y, v.z);
  return buf;
}

/// "3", "0-31", "0-3, 8, 10-12": a sorted list of indices, with ranges.
std::string ranges(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (!s.empty()) s += ", ";
    s += std::to_string(v[i]);
    if (j > i) {
      s += '-';
      s += std::to_string(v[j]);
    }
    i = j + 1;
  }
  return s;
}

/// PTX's shfl source lane (shfl.sync with c = ((32 - width) << 8) | clamp): the lane that
/// `lane` reads, or `lane` itself when the source falls outside its segment of `width`.
int shuffle_source(Collective k, int lane, int b, int width) {
  const int64_t segmask = 32 - width;  // the lanes' high bits that name the segment
  const int64_t clamp = k == Collective::ShflUp ? 0 : 31;
  const int64_t max_lane = (lane & segmask) | (clamp & ~segmask);
  const int64_t min_lane = lane & segmask;
  int64_t j = lane;
  bool inside = false;
  switch (k) {
    case Collective::ShflUp:
      j = int64_t(lane) - int64_t(unsigned(b));
      inside = j >= max_lane;
      break;
    case Collective::ShflDown:
      j = int64_t(lane) + int64_t(unsigned(b));
      inside = j <= max_lane;
      break;
    case Collective::ShflXor:
      j = int64_t(lane ^ b);
      inside = j >= 0 && j <= max_lane;
      break;
    default:  // Shfl
      j = min_lane | (int64_t(b) & 31 & ~segmask);
      inside = j <= max_lane;
      break;
  }
  return inside ? int(j) : lane;
}

// ---- a grid -------------------------------------------------------------------------------------
/// One launch being run: blocks are taken in increasing linear index by whichever OS
/// thread is free; the first fault stops the rest.
struct GridRun {
  explicit GridRun(const KernelLaunch& l) : launch(l), blocks(uint64_t(l.grid.x) * l.grid.y * l.grid.z) {}
  const KernelLaunch& launch;
  const uint64_t blocks;
  std::atomic<uint64_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  Fault fault;

  void report(cudaError_t e, std::string message) {
    std::lock_guard<std::mutex> lock(mu);
    if (fault.error == cudaSuccess) fault = {e, std::move(message)};
    stop = true;
  }
  void work(Worker& w);
};

// ---- the fibers of one OS thread ------------------------------------------------------------------
/// What one OS thread needs to run blocks: fiber i runs thread i of its current block.
class Worker {
 public:
  ~Worker() {
    quitting_ = true;
    for (auto& s : slots_) s->fiber.resume();  // each returns from fiber_main
  }
  Fiber& fiber(int i) {
    while (int(slots_.size()) <= i) {
      auto s = std::make_unique<Slot>(this, int(slots_.size()));
      slots_.push_back(std::move(s));
    }
    return slots_[size_t(i)]->fiber;
  }
  Block* block = nullptr;

 private:
  struct Slot {
    Slot(Worker* w, int i) : worker(w), index(i), fiber(fiber_stack_bytes(), &fiber_main, this) {}
    Worker* worker;
    int index;
    Fiber fiber;
  };
  static void fiber_main(void* arg);

  std::vector<std::unique_ptr<Slot>> slots_;
  bool quitting_ = false;
};

Worker& this_worker() {
  thread_local std::unique_ptr<Worker> w = std::make_unique<Worker>();
  return *w;
}

// ---- a block ----------------------------------------------------------------------------------------
thread_local Block* t_block = nullptr;

class Block {
 public:
  Block(GridRun& grid, Worker& worker, uint64_t linear)
      : grid_(grid),
        worker_(worker),
        launch_(grid.launch),
        n_(int(launch_.block.x * launch_.block.y * launch_.block.z)),
        threads_(size_t(n_)),
        warp_ops_(size_t((n_ + 31) / 32)) {
    const dim3 g = launch_.grid;
    index_ = {unsigned(linear % g.x), unsigned(linear / g.x % g.y), unsigned(linear / (uint64_t(g.x) * g.y))};
    const Schedule s = schedule();
    reverse_ = s == Schedule::Reverse || (s == Schedule::Alternate && linear % 2 == 1);
    if (launch_.shared_bytes > 0) {
      shared_.reset(new unsigned char[launch_.shared_bytes]);
      poison(shared_.get(), launch_.shared_bytes);
    }
  }

  /// Runs the block to its end, on the worker's own stack.
  void run();
  /// The body of thread t's fiber: the kernel, then the thread's end.
  void run_thread(int t);

  int barrier(Site s, BarrierOp op, int predicate);
  unsigned long long collective(Site s, Collective kind, unsigned mask, unsigned long long value, int arg, int width);
  unsigned active_mask() const;
  void* dynamic_shared() const { return shared_.get(); }
  void print(std::FILE* out) const;
  [[noreturn]] void fault_now(cudaError_t e, const std::string& what);

 private:
  uint3 thread_index(int t) const {
    const dim3 b = launch_.block;
    return {unsigned(t) % b.x, unsigned(t) / b.x % b.y, unsigned(t) / (b.x * b.y)};
  }
  void resume(int t);
  void suspend(int t);
  void on_exit(int t);
  void record_fault(cudaError_t e, const std::string& what);
  const WarpOp* op_waiting_for(int t) const;
  void complete(int w, const WarpOp& op);
  std::vector<int> threads_in(State s) const;
  std::string describe_deadlock() const;

  GridRun& grid_;
  Worker& worker_;
  const KernelLaunch& launch_;
  const int n_;
  uint3 index_{};
  bool reverse_ = false;
  std::unique_ptr<unsigned char[]> shared_;

  std::vector<Thread> threads_;
  int current_ = -1;
  int exited_ = 0;
  bool restart_ = false;   // a barrier completed: the next round starts at the order's beginning
  bool aborting_ = false;  // a fault: every thread ends at its next wait

  // the barrier being filled
  int at_barrier_ = 0;
  Site barrier_site_{};
  int barrier_count_ = 0;
  int barrier_result_ = 0;

  std::vector<std::vector<WarpOp>> warp_ops_;  // per warp, the collectives being filled
};

void Worker::fiber_main(void* arg) {
  Slot& slot = *static_cast<Slot*>(arg);
  for (;;) {
    if (slot.worker->quitting_) return;
    slot.worker->block->run_thread(slot.index);
    slot.fiber.suspend();  // idle until the next block needs this thread
  }
}

void Block::run() {
  t_block = this;
  worker_.block = this;
  blockIdx = index_;
  blockDim = launch_.block;
  gridDim = launch_.grid;
  while (exited_ < n_) {
    bool ran = false;
    restart_ = false;
    for (int k = 0; k < n_ && !restart_; ++k) {
      const int t = reverse_ ? n_ - 1 - k : k;
      if (threads_[size_t(t)].state != State::Runnable) continue;
      if (aborting_ && !threads_[size_t(t)].started) {  // never started: nothing to unwind
        threads_[size_t(t)].state = State::Exited;
        ++exited_;
        continue;
      }
      resume(t);
      ran = true;
    }
    if (ran || exited_ == n_) continue;
    // Nobody can go on: a deadlock the checks on arrival did not catch, or an abort whose
    // waiting threads must now unwind (each throws AbortThread from its wait).
    if (!aborting_) record_fault(cudaErrorLaunchFailure, describe_deadlock());
    for (Thread& th : threads_)
      if (th.state == State::AtBarrier || th.state == State::AtWarp) th.state = State::Runnable;
  }
  t_block = nullptr;
  worker_.block = nullptr;
}

void Block::resume(int t) {
  Thread& th = threads_[size_t(t)];
  th.state = State::Running;
  th.started = true;
  current_ = t;
  threadIdx = thread_index(t);
  worker_.fiber(t).resume();
}

void Block::suspend(int t) {
  worker_.fiber(t).suspend();
  if (aborting_) throw AbortThread{};
}

void Block::run_thread(int t) {
  try {
    launch_.thread_body();
  } catch (const AbortThread&) {
  } catch (const std::exception& e) {
    record_fault(cudaErrorLaunchFailure, std::string("the kernel threw an exception: ") + e.what());
  } catch (...) {
    record_fault(cudaErrorLaunchFailure, "the kernel threw an exception");
  }
  on_exit(t);
}

void Block::on_exit(int t) {
  threads_[size_t(t)].state = State::Exited;
  ++exited_;
  if (aborting_) return;
  if (at_barrier_ > 0) {
    record_fault(cudaErrorLaunchFailure, "divergent __syncthreads: thread " + std::to_string(t) +
                                             " exited while threads " + ranges(threads_in(State::AtBarrier)) +
                                             " wait at __syncthreads (" + where(barrier_site_) +
                                             "); every thread of a block must reach each __syncthreads");
    return;
  }
  if (const WarpOp* op = op_waiting_for(t))
    record_fault(cudaErrorLaunchFailure, "lane " + std::to_string(t & 31) + " of warp " + std::to_string(t >> 5) +
                                             " exited while lanes of the mask " + hex(op->mask) + " wait for it at " +
                                             collective_name(op->kind) + " (" + where(op->site) + ")");
}

void Block::record_fault(cudaError_t e, const std::string& what) {
  if (aborting_) return;
  aborting_ = true;
  const uint3 ti = current_ >= 0 ? thread_index(current_) : uint3{0, 0, 0};
  grid_.report(e, "kernel " + kernel_name(launch_.kernel) + ", block " + triple(index_) + ", thread " + triple(ti) +
                      ": " + what);
}

void Block::fault_now(cudaError_t e, const std::string& what) {
  record_fault(e, what);
  throw AbortThread{};
}

std::vector<int> Block::threads_in(State s) const {
  std::vector<int> v;
  for (int t = 0; t < n_; ++t)
    if (threads_[size_t(t)].state == s) v.push_back(t);
  return v;
}

const WarpOp* Block::op_waiting_for(int t) const {
  for (const WarpOp& op : warp_ops_[size_t(t >> 5)])
    if ((op.mask >> (t & 31) & 1u) && !(op.arrived >> (t & 31) & 1u)) return &op;
  return nullptr;
}

int Block::barrier(Site s, BarrierOp op, int predicate) {
  const int t = current_;
  if (exited_ > 0)
    fault_now(cudaErrorLaunchFailure, "divergent __syncthreads (" + where(s) + "): threads " +
                                          ranges(threads_in(State::Exited)) +
                                          " have exited; every thread of a block must reach each __syncthreads");
  if (at_barrier_ > 0 && !same_site(s, barrier_site_))
    fault_now(cudaErrorLaunchFailure, "divergent __syncthreads: thread " + std::to_string(t) + " is at " + where(s) +
                                          " while threads " + ranges(threads_in(State::AtBarrier)) + " wait at " +
                                          where(barrier_site_));
  if (const WarpOp* w = op_waiting_for(t))
    fault_now(cudaErrorLaunchFailure, "thread " + std::to_string(t) + " reached __syncthreads (" + where(s) +
                                          ") while lanes of its warp wait for it at " + collective_name(w->kind) +
                                          " (" + where(w->site) + ")");
  if (at_barrier_ == 0) {
    barrier_site_ = s;
    barrier_count_ = 0;
  }
  ++at_barrier_;
  barrier_count_ += predicate != 0;
  Thread& th = threads_[size_t(t)];
  th.state = State::AtBarrier;
  th.site = s;
  if (at_barrier_ == n_) {  // the last one: release everybody, the next round in order
    switch (op) {
      case BarrierOp::None: barrier_result_ = 0; break;
      case BarrierOp::Count: barrier_result_ = barrier_count_; break;
      case BarrierOp::And: barrier_result_ = barrier_count_ == n_; break;
      case BarrierOp::Or: barrier_result_ = barrier_count_ > 0; break;
    }
    at_barrier_ = 0;
    for (Thread& x : threads_)
      if (x.state == State::AtBarrier) x.state = State::Runnable;
    restart_ = true;
  }
  suspend(t);
  return barrier_result_;
}

unsigned long long Block::collective(Site s, Collective kind, unsigned mask, unsigned long long value, int arg,
                                     int width) {
  const int t = current_, lane = t & 31, w = t >> 5;
  const int lanes = std::min(32, n_ - w * 32);
  const unsigned present = lanes == 32 ? ~0u : (1u << lanes) - 1u;
  const std::string name = std::string(collective_name(kind)) + " (" + where(s) + ")";
  if (is_shuffle(kind) && (width < 1 || width > 32 || (width & (width - 1)) != 0))
    fault_now(cudaErrorLaunchFailure, name + ": width " + std::to_string(width) + " is not a power of two up to 32");
  if (!(mask >> lane & 1u))
    fault_now(cudaErrorLaunchFailure, "lane " + std::to_string(lane) + " of warp " + std::to_string(w) + " calls " +
                                          name + " with mask " + hex(mask) + ", which does not include it");
  if (mask & ~present)
    fault_now(cudaErrorLaunchFailure, name + ": the mask " + hex(mask) + " names lanes that do not exist (warp " +
                                          std::to_string(w) + " has " + std::to_string(lanes) + ")");
  for (int l = 0; l < lanes; ++l) {
    if (!(mask >> l & 1u) || l == lane) continue;
    const Thread& other = threads_[size_t(w * 32 + l)];
    if (other.state == State::Exited)
      fault_now(cudaErrorLaunchFailure, name + " with mask " + hex(mask) + " in warp " + std::to_string(w) + ": lane " +
                                            std::to_string(l) + ", named in the mask, has exited");
    if (other.state == State::AtBarrier)
      fault_now(cudaErrorLaunchFailure, name + " with mask " + hex(mask) + " in warp " + std::to_string(w) + ": lane " +
                                            std::to_string(l) + ", named in the mask, waits at __syncthreads (" +
                                            where(other.site) + ")");
  }
  // Join the collective the other lanes of this mask wait at. Lanes may wait at several
  // collectives at once (a __syncwarp of the whole warp while half of it shuffles among
  // itself first); two different collectives with the same mask cannot both complete.
  std::vector<WarpOp>& ops = warp_ops_[size_t(w)];
  size_t k = 0;
  for (; k < ops.size(); ++k) {
    const WarpOp& o = ops[k];
    if (o.mask != mask) continue;
    if (o.kind != kind || (kind != Collective::SyncWarp && !same_site(o.site, s)))
      fault_now(cudaErrorLaunchFailure, "lane " + std::to_string(lane) + " of warp " + std::to_string(w) + " is at " +
                                            name + " while the other lanes of its mask " + hex(mask) + " wait at " +
                                            collective_name(o.kind) + " (" + where(o.site) + ")");
    if (o.width != width)
      fault_now(cudaErrorLaunchFailure, name + ": lanes of warp " + std::to_string(w) + " pass widths " +
                                            std::to_string(o.width) + " and " + std::to_string(width));
    break;
  }
  if (k == ops.size()) ops.push_back(WarpOp{kind, mask, s, width});
  WarpOp& op = ops[k];
  op.value[lane] = value;
  op.arg[lane] = arg;
  op.arrived |= 1u << lane;
  if (op.arrived == op.mask) {  // the last lane: everybody's result, and this lane goes on
    const WarpOp done = op;
    ops.erase(ops.begin() + std::ptrdiff_t(k));
    complete(w, done);
    threads_[size_t(t)].state = State::Running;
    return threads_[size_t(t)].result;
  }
  Thread& th = threads_[size_t(t)];
  th.state = State::AtWarp;
  th.site = s;
  th.kind = kind;
  suspend(t);
  return th.result;
}

void Block::complete(int w, const WarpOp& op) {
  unsigned ballot = 0;
  for (int l = 0; l < 32; ++l)
    if ((op.mask >> l & 1u) && op.value[l] != 0) ballot |= 1u << l;
  // the reductions over the mask's lanes (__reduce_*_sync: 32-bit operands)
  unsigned long long reduced = 0;
  bool first = true;
  for (int l = 0; l < 32; ++l) {
    if (!(op.mask >> l & 1u)) continue;
    const uint32_t u = uint32_t(op.value[l]);
    const int32_t i = int32_t(u);
    uint32_t r = uint32_t(reduced);
    switch (op.kind) {
      case Collective::ReduceAddU:
      case Collective::ReduceAddS: r = first ? u : r + u; break;
      case Collective::ReduceMinU: r = first ? u : std::min(r, u); break;
      case Collective::ReduceMaxU: r = first ? u : std::max(r, u); break;
      case Collective::ReduceMinS: r = uint32_t(first ? i : std::min(int32_t(r), i)); break;
      case Collective::ReduceMaxS: r = uint32_t(first ? i : std::max(int32_t(r), i)); break;
      case Collective::ReduceAnd: r = first ? u : r & u; break;
      case Collective::ReduceOr: r = first ? u : r | u; break;
      case Collective::ReduceXor: r = first ? u : r ^ u; break;
      default: break;
    }
    reduced = r;
    first = false;
  }
  bool all_equal = true;
  for (int l = 0; l < 32; ++l)
    if ((op.mask >> l & 1u) && op.value[l] != op.value[std::countr_zero(op.mask)]) all_equal = false;
  for (int l = 0; l < 32; ++l) {
    if (!(op.mask >> l & 1u)) continue;
    unsigned long long r = 0;
    switch (op.kind) {
      case Collective::SyncWarp: break;
      case Collective::Shfl:
      case Collective::ShflUp:
      case Collective::ShflDown:
      case Collective::ShflXor: {
        const int j = shuffle_source(op.kind, l, op.arg[l], op.width);
        if (!(op.mask >> j & 1u))
          fault_now(cudaErrorLaunchFailure, std::string(collective_name(op.kind)) + " (" + where(op.site) +
                                                ") in warp " + std::to_string(w) + ": lane " + std::to_string(l) +
                                                " reads lane " + std::to_string(j) + ", which is not in the mask " +
                                                hex(op.mask) + " (its value is undefined)");
        r = op.value[j];
        break;
      }
      case Collective::Ballot: r = ballot; break;
      case Collective::Any: r = ballot != 0; break;
      case Collective::All: r = ballot == op.mask; break;
      case Collective::MatchAny:
        for (int m = 0; m < 32; ++m)
          if ((op.mask >> m & 1u) && op.value[m] == op.value[l]) r |= 1ull << m;
        break;
      case Collective::MatchAll: r = all_equal ? (op.mask | (1ull << 32)) : 0; break;
      default: r = reduced; break;
    }
    Thread& th = threads_[size_t(w * 32 + l)];
    th.result = r;
    if (th.state == State::AtWarp) th.state = State::Runnable;
  }
}

unsigned Block::active_mask() const {
  const int w = current_ >> 5;
  unsigned m = 0;
  for (int l = 0; l < 32 && w * 32 + l < n_; ++l)
    if (threads_[size_t(w * 32 + l)].state != State::Exited) m |= 1u << l;
  return m;
}

std::string Block::describe_deadlock() const {
  std::string s = "no thread of the block can go on:";
  for (int w = 0; w < int(warp_ops_.size()); ++w)
    for (const WarpOp& op : warp_ops_[size_t(w)]) {
      std::vector<int> missing;
      for (int l = 0; l < 32; ++l)
        if ((op.mask >> l & 1u) && !(op.arrived >> l & 1u)) missing.push_back(l);
      s += " in warp " + std::to_string(w) + ", " + collective_name(op.kind) + " (" + where(op.site) + ") with mask " +
           hex(op.mask) + " waits for lanes " + ranges(missing) + ";";
    }
  const std::vector<int> at = threads_in(State::AtBarrier);
  if (!at.empty()) s += " threads " + ranges(at) + " wait at __syncthreads (" + where(barrier_site_) + ");";
  return s;
}

void Block::print(std::FILE* out) const {
  std::fprintf(out, "block %s of grid %s, %d threads of block %s, running thread %d %s:\n", triple(index_).c_str(),
               triple(launch_.grid).c_str(), n_, triple(launch_.block).c_str(), current_,
               triple(thread_index(current_)).c_str());
  // consecutive threads in the same state share a line
  for (int t = 0; t < n_;) {
    const Thread& a = threads_[size_t(t)];
    int u = t;
    auto same = [&](const Thread& b) {
      return b.state == a.state && b.started == a.started &&
             (a.state != State::AtBarrier && a.state != State::AtWarp ? true : same_site(a.site, b.site));
    };
    while (u + 1 < n_ && same(threads_[size_t(u + 1)])) ++u;
    std::string what;
    switch (a.state) {
      case State::Runnable: what = a.started ? "released, not yet resumed" : "not started"; break;
      case State::Running: what = "running"; break;
      case State::AtBarrier: what = "waits at __syncthreads (" + where(a.site) + ")"; break;
      case State::AtWarp: what = std::string("waits at ") + collective_name(a.kind) + " (" + where(a.site) + ")"; break;
      case State::Exited: what = "exited"; break;
    }
    if (u == t)
      std::fprintf(out, "  thread %d: %s\n", t, what.c_str());
    else
      std::fprintf(out, "  threads %d-%d: %s\n", t, u, what.c_str());
    t = u + 1;
  }
}

void GridRun::work(Worker& w) {
  for (;;) {
    if (stop.load(std::memory_order_relaxed)) return;
    const uint64_t b = next.fetch_add(1);
    if (b >= blocks) return;
    Block block(*this, w, b);
    block.run();
  }
}

// ---- the pool -----------------------------------------------------------------------------------------
/// OS threads that help run a grid's blocks; the thread that runs the launch works too.
class Pool {
 public:
  explicit Pool(int helpers) {
    for (int i = 0; i < helpers; ++i) threads_.emplace_back([this] { loop(); });
  }
  int helpers() const { return int(threads_.size()); }

  void run(GridRun& g, int wanted) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      grid_ = &g;
      wanted_ = wanted;
      taken_ = 0;
      ++generation_;
    }
    wake_.notify_all();
    g.work(this_worker());
    std::unique_lock<std::mutex> lock(mu_);
    wanted_ = 0;  // a helper that has not woken yet stays out
    done_.wait(lock, [&] { return active_ == 0; });
    grid_ = nullptr;
  }

 private:
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      GridRun* g;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return generation_ != seen && taken_ < wanted_; });
        seen = generation_;
        ++taken_;
        ++active_;
        g = grid_;
      }
      g->work(this_worker());
      {
        std::lock_guard<std::mutex> lock(mu_);
        --active_;
      }
      done_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, done_;
  GridRun* grid_ = nullptr;
  int wanted_ = 0, taken_ = 0, active_ = 0;
  uint64_t generation_ = 0;
  std::vector<std::thread> threads_;
};

int threads_setting() {
  static const int n = [] {
    const long hw = long(std::max(1u, std::thread::hardware_concurrency()));
    return int(std::clamp(env_long("AMPGRAD_CUDA_EMULATOR_THREADS", std::min(hw, 8L)), 1L, 64L));
  }();
  return n;
}

Pool& pool() {
  // never destroyed: its threads wait for work until the process ends
  static Pool* p = new Pool(threads_setting() - 1);
  return *p;
}

Block& current_block(const char* what) {
  if (!t_block) {
    std::fprintf(stderr, "ampgrad CUDA emulator: %s called outside a kernel\n", what);
    std::abort();
  }
  return *t_block;
}

}  // namespace

// ---- the entry points of emu/device.h --------------------------------------------------------------------
int barrier(Site site, BarrierOp op, int predicate) {
  return current_block("__syncthreads").barrier(site, op, predicate);
}

unsigned long long warp_collective(Site site, Collective kind, unsigned mask, unsigned long long value, int arg,
                                   int width) {
  return current_block(collective_name(kind)).collective(site, kind, mask, value, arg, width);
}

unsigned active_mask() { return current_block("__activemask").active_mask(); }

void* dynamic_shared_memory() { return current_block("dynamic_shared").dynamic_shared(); }

void trap(Site site, const char* what) {
  current_block(what).fault_now(cudaErrorLaunchFailure, std::string(what) + " at " + where(site));
}

long long clock_ticks() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Fault run_grid(const KernelLaunch& launch) {
  GridRun g(launch);
  const int helpers = int(std::min<uint64_t>(uint64_t(threads_setting() - 1), g.blocks - 1));
  if (helpers > 0)
    pool().run(g, helpers);
  else
    g.work(this_worker());
  return g.fault;
}

}  // namespace detail

Schedule schedule() {
  int s = detail::g_schedule.load(std::memory_order_relaxed);
  if (s < 0) {
    s = int(detail::schedule_from_env());
    detail::g_schedule.store(s, std::memory_order_relaxed);
  }
  return Schedule(s);
}
void set_schedule(Schedule s) { detail::g_schedule.store(int(s), std::memory_order_relaxed); }

int worker_threads() { return detail::threads_setting(); }

void print_block() {
  if (!detail::t_block) {
    std::fprintf(stderr, "ampgrad CUDA emulator: no block is running on this thread\n");
    return;
  }
  detail::t_block->print(stderr);
}

}  // namespace ampgrad::emu
