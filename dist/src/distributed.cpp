// ProcessGroup over MPI (distributed.h).
//
// Every collective is MPI's non-blocking form, waited for by polling MPI_Test against a
// deadline, so that a missing rank turns into an error instead of a hang. On the deadline
// each waiting rank sends the number of the collective it waits in to every other rank on
// a second communicator and listens for a grace period: a rank that sends nothing (or a
// lower number) did not reach the collective, and the error names it. MPI_ERRORS_RETURN on
// both communicators turns MPI's failures into ag::Error as well. float16 and bfloat16
// reductions go through a float32 copy, or (reduce_in_half) through MPI operations of our
// own on their bits. A driver thread runs the collectives in the order they were started,
// so that all_reduce_async overlaps the caller's work.
#include "ampgrad/dist/distributed.h"

#include "dist_internal.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ampgrad/autograd.h"
#include "ampgrad/factories.h"
#include "ampgrad/half.h"

#if AMPGRAD_WITH_MPI
#include <mpi.h>
#endif
#ifdef __linux__
#include <sys/prctl.h>
#endif

namespace ampgrad::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

bool launched_by_mpi() {
  // OpenMPI's mpirun, and the PMI launchers of MPICH, Intel MPI and Slurm
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

namespace {
std::chrono::milliseconds timeout_from_env() {
  const char* env = std::getenv("AMPGRAD_DIST_TIMEOUT");
  if (env == nullptr || *env == '\0') return std::chrono::milliseconds(300000);
  char* end = nullptr;
  const double s = std::strtod(env, &end);
  AG_CHECK(end != env && *end == '\0' && s > 0 && s < 1e9, "dist", "AMPGRAD_DIST_TIMEOUT must be a positive number of seconds, got \"",
           env, "\"");
  return std::chrono::milliseconds(int64_t(s * 1000));
}

// True for a CUDA tensor, which goes through NCCL.
bool check_tensor(const Tensor& t, const char* op) {
  AG_CHECK(t.defined(), op, "the tensor is undefined");
  AG_CHECK(t.is_contiguous(), op, "expected a contiguous tensor, got shape ", t.sizes(), " with strides ", t.strides());
  if (t.device().type == kCPU) return false;
  AG_CHECK(t.device().type == kCUDA && built_with_nccl(), op,
           "a tensor on ", t.device(), " needs NCCL, which this build has not (CPU tensors go through MPI)");
  return true;
}
}  // namespace

void ProcessGroup::set_timeout(std::chrono::milliseconds t) {
  AG_CHECK(t.count() > 0, "dist", "the timeout must be positive, got ", t.count(), " ms");
  timeout_ = t;
}

// ---- Work ----------------------------------------------------------------------------------

struct Work::State {
  const char* op = "";
  std::function<int(void* request)> start;  // starts the MPI collective (null: nothing to send)
  std::function<void()> finish;             // run by wait(), on the waiting thread
  std::mutex mu;
  std::condition_variable cv;
  bool done = false, finished = false;
  std::exception_ptr error;
  std::atomic<int> waiters{0};  // someone blocks in wait(): the driver polls hard
};

void Work::wait() {
  AG_CHECK(state_ != nullptr, "dist", "wait() on an empty Work");
  State& s = *state_;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    ++s.waiters;
    s.cv.wait(lock, [&] { return s.done; });
    --s.waiters;
    if (s.error) std::rethrow_exception(s.error);
    if (s.finished) return;
    s.finished = true;
  }
  if (s.finish) {
    NoGradGuard ng;
    s.finish();
  }
}

bool Work::completed() const {
  if (state_ == nullptr) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

namespace detail {
Work completed_work(std::function<void()> finish) {
  auto w = std::make_shared<Work::State>();
  w->op = "nccl";
  w->finish = std::move(finish);
  w->done = true;
  return Work(w);
}
}  // namespace detail

#if AMPGRAD_WITH_MPI

bool built_with_mpi() { return true; }

// Collectives run in the order they were started, on one thread at a time: the group's
// driver thread when MPI allows calls from several threads (MPI_THREAD_SERIALIZED), else
// the caller's, at once (no overlap).
struct ProcessGroup::Impl {
  MPI_Comm comm = MPI_COMM_NULL, diag = MPI_COMM_NULL;
  bool finalize = false;
  bool threaded = false;  // MPI_THREAD_SERIALIZED or better: a driver thread
  std::mutex mu;          // the queue, the flags below
  std::condition_variable cv;
  std::deque<std::shared_ptr<Work::State>> queue;
  std::thread driver;
  bool stop = false;
  std::atomic<bool> stopping{false};
  std::string broken;  // why the group is unusable, once it is
};

namespace {

void check_mpi(int rc, const char* op, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  AG_ERROR(op, what, " failed: ", std::string(msg, size_t(len)));
}

MPI_Datatype mpi_type(DType d, const char* op) {
  switch (d) {
    case kFloat32: return MPI_FLOAT;
    case kFloat64: return MPI_DOUBLE;
    case kInt64: return MPI_INT64_T;
    case kInt32: return MPI_INT32_T;
    case kUInt8: return MPI_UINT8_T;
    case kBool: return MPI_C_BOOL;
    case kFloat16:
    case kBFloat16: return MPI_UINT16_T;  // moved as bits; reduced through float32
  }
  AG_ERROR(op, "no MPI type for dtype ", int(d));  // every dtype has a case above
}

MPI_Op mpi_op(ReduceOp op, DType d, const char* name) {
  if (d == kBool) {
    AG_CHECK(op != ReduceOp::Avg, name, "avg of a bool tensor is not defined");
    return op == ReduceOp::Min ? MPI_LAND : MPI_LOR;  // sum and max: any; min: all
  }
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

// 16-bit reductions in their own type: MPI has no such types, so each is a duplicate of
// MPI_UINT16_T that the reduction functions recognise, with one MPI_Op per ReduceOp.
MPI_Datatype g_f16_type = MPI_DATATYPE_NULL, g_bf16_type = MPI_DATATYPE_NULL;
MPI_Op g_half_ops[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};  // sum, max, min

template <class H, int Op>
void reduce16(const void* in, void* inout, int n) {
  const H* a = static_cast<const H*>(in);
  H* b = static_cast<H*>(inout);
  for (int i = 0; i < n; ++i) {
    const float x = a[i], y = b[i];
    b[i] = H(Op == 0 ? x + y : Op == 1 ? std::max(x, y) : std::min(x, y));
  }
}

template <int Op>
void reduce16_op(void* in, void* inout, int* len, MPI_Datatype* type) {
  if (*type == g_bf16_type) reduce16<BFloat16, Op>(in, inout, *len);
  else reduce16<Half, Op>(in, inout, *len);
}

void make_half_ops() {
  if (g_f16_type != MPI_DATATYPE_NULL) return;
  MPI_Type_dup(MPI_UINT16_T, &g_f16_type);
  MPI_Type_dup(MPI_UINT16_T, &g_bf16_type);
  MPI_Op_create(&reduce16_op<0>, 1, &g_half_ops[0]);
  MPI_Op_create(&reduce16_op<1>, 1, &g_half_ops[1]);
  MPI_Op_create(&reduce16_op<2>, 1, &g_half_ops[2]);
}

MPI_Op half_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return g_half_ops[0];
    case ReduceOp::Max: return g_half_ops[1];
    case ReduceOp::Min: return g_half_ops[2];
  }
  return g_half_ops[0];
}

}  // namespace

ProcessGroup::ProcessGroup() : impl_(std::make_unique<Impl>()) {
  int inited = 0, level = MPI_THREAD_SINGLE;
  MPI_Initialized(&inited);
  if (!inited) {
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &level), "dist", "MPI_Init_thread");
    impl_->finalize = true;
  } else {
    MPI_Query_thread(&level);
  }
  impl_->threaded = level >= MPI_THREAD_SERIALIZED;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &impl_->comm), "dist", "MPI_Comm_dup");
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &impl_->diag), "dist", "MPI_Comm_dup");
  MPI_Comm_set_errhandler(impl_->comm, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(impl_->diag, MPI_ERRORS_RETURN);
  MPI_Comm_rank(impl_->comm, &rank_);
  MPI_Comm_size(impl_->comm, &size_);
  MPI_Comm local = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(impl_->comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local), "dist",
            "MPI_Comm_split_type");
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);
  make_half_ops();
  timeout_ = timeout_from_env();
}

ProcessGroup::~ProcessGroup() = default;

namespace {
ProcessGroup::Impl* g_world = nullptr;

// At exit: the driver thread stops (abandoning a collective in flight, which breaks the
// group), then MPI_Finalize, which waits for every rank; a broken group may have ranks
// that never get there, so it ends the whole job with MPI_Abort instead.
void finish_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (g_world != nullptr) {
    {
      std::lock_guard<std::mutex> lock(g_world->mu);
      g_world->stop = true;
      g_world->stopping = true;
    }
    g_world->cv.notify_all();
    if (g_world->driver.joinable()) g_world->driver.join();
    if (!g_world->broken.empty()) MPI_Abort(MPI_COMM_WORLD, 3);
  }
  MPI_Finalize();
}
}  // namespace

ProcessGroup& ProcessGroup::world() {
  // Never destroyed: MPI is finalised from atexit, after which no MPI call may happen.
  static ProcessGroup* pg = [] {
    auto* g = new ProcessGroup();
    g_world = g->impl_.get();
    if (g->impl_->finalize) std::atexit(finish_mpi);
    return g;
  }();
  return *pg;
}

namespace {

// Waits for req until the group's deadline; past it, finds the ranks that never reached
// collective number `seq` and throws naming them.
void wait(ProcessGroup::Impl& impl, MPI_Request& req, int64_t seq, int rank, int size,
          std::chrono::milliseconds timeout, const char* op, const std::atomic<int>& waiters) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  for (int idle = 0;; ++idle) {
    int done = 0;
    check_mpi(MPI_Test(&req, &done, MPI_STATUS_IGNORE), op, "waiting for the other ranks");
    if (done) return;
    if (Clock::now() >= deadline) break;
    AG_CHECK(!impl.stopping.load(), op, "the process is exiting with this collective in flight");
    // MPI moves a non-blocking collective forward only inside MPI calls, so the polling
    // rate is its speed. At first, and while a caller waits (its core is free), poll
    // without pause, yielding to other processes (ranks often share cores); while the
    // caller computes, poll every few microseconds (the driver's timer slack is small),
    // backing off to a millisecond when nothing comes for long.
    if (idle < 2000) continue;
    if (waiters.load() > 0) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(idle > 200000 ? 1000 : 5));
  }
  // Who is there: every waiting rank tells every other rank the collective it waits in.
  const int64_t mine = seq;
  std::vector<int64_t> theirs(size_t(size), -1);
  std::vector<MPI_Request> reqs;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    reqs.emplace_back();
    MPI_Isend(&mine, 1, MPI_INT64_T, r, 1, impl.diag, &reqs.back());
    reqs.emplace_back();
    MPI_Irecv(&theirs[size_t(r)], 1, MPI_INT64_T, r, 1, impl.diag, &reqs.back());
  }
  const auto grace = Clock::now() + std::min<std::chrono::milliseconds>(timeout, std::chrono::milliseconds(3000));
  while (Clock::now() < grace) {
    int all = 0;
    MPI_Testall(int(reqs.size()), reqs.data(), &all, MPI_STATUSES_IGNORE);
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::vector<int> missing;
  for (int r = 0; r < size; ++r)
    if (r != rank && theirs[size_t(r)] < mine) missing.push_back(r);
  for (MPI_Request& r : reqs)
    if (r != MPI_REQUEST_NULL) {
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
  // The collective's own request stays pending (MPI cannot cancel a collective): the group
  // is unusable from here on, and the job ends with MPI_Abort at exit.
  std::ostringstream why;
  why << "rank " << rank << " of " << size << " waited " << double(timeout.count()) / 1000 << " s in " << op
      << " (collective " << seq + 1 << ") for ";
  if (missing.empty()) {
    why << "ranks that all reached it (a rank that is slower than the timeout?)";
  } else {
    why << (missing.size() == 1 ? "rank " : "ranks ");
    for (size_t i = 0; i < missing.size(); ++i) why << (i ? ", " : "") << missing[i];
    why << ", which never reached it: " << (missing.size() == 1 ? "that process" : "those processes")
        << " died or stopped calling the collectives";
  }
  AG_ERROR(op, why.str());
}

}  // namespace

// Runs one collective to its end (or its error) on the current thread.
void ProcessGroup::execute(Work::State& w) {
  try {
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      AG_CHECK(impl_->broken.empty(), w.op, "the process group is unusable after an earlier error: ", impl_->broken);
    }
    if (w.start) {
      MPI_Request req = MPI_REQUEST_NULL;
      check_mpi(w.start(&req), w.op, "starting the collective");
      try {
        wait(*impl_, req, calls_.load(), rank_, size_, timeout_, w.op, w.waiters);
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(impl_->mu);
        if (impl_->broken.empty()) impl_->broken = e.what();
        throw;
      }
      ++calls_;
    }
  } catch (...) {
    w.error = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.done = true;
  }
  w.cv.notify_all();
}

Work ProcessGroup::submit(const char* op, std::function<int(void*)> start, std::function<void()> finish) {
  auto w = std::make_shared<Work::State>();
  w->op = op;
  w->start = std::move(start);
  w->finish = std::move(finish);
  if (!impl_->threaded) {
    execute(*w);
    return Work(w);
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    AG_CHECK(!impl_->stop, op, "the process is exiting");
    impl_->queue.push_back(w);
    if (!impl_->driver.joinable()) {
      impl_->driver = std::thread([this] {
#ifdef __linux__
        prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);  // 1 us: short polling sleeps stay short
#endif
        for (;;) {
          std::shared_ptr<Work::State> next;
          {
            std::unique_lock<std::mutex> lock(impl_->mu);
            impl_->cv.wait(lock, [&] { return impl_->stop || !impl_->queue.empty(); });
            if (impl_->queue.empty()) return;
            next = std::move(impl_->queue.front());
            impl_->queue.pop_front();
          }
          execute(*next);
        }
      });
    }
  }
  impl_->cv.notify_all();
  return Work(w);
}

void ProcessGroup::barrier() {
  submit("barrier", [this](void* r) { return MPI_Ibarrier(impl_->comm, static_cast<MPI_Request*>(r)); }, nullptr)
      .wait();
}

Work ProcessGroup::all_reduce_async(const Tensor& t, ReduceOp op, bool reduce_in_half) {
  const char* name = "all_reduce";
  const bool cuda = check_tensor(t, name);
  const DType dt = t.dtype();
  AG_CHECK(op != ReduceOp::Avg || t.is_floating_point(), name, "avg needs a floating tensor, got ",
           dtype_name(dt));
  if (cuda) return t.numel() ? detail::nccl_all_reduce(*this, t, op, reduce_in_half) : detail::completed_work(nullptr);
  const bool half = dt == kFloat16 || dt == kBFloat16;
  const bool widen = half && !reduce_in_half;  // reduced in float32, rounded once
  const bool average = op == ReduceOp::Avg && size_ > 1;
  AG_CHECK(t.numel() < (int64_t(1) << 31), name, "tensors of more than 2^31 - 1 elements are not supported, got ",
           t.numel());
  const MPI_Op mop = half && !widen ? half_op(op) : mpi_op(op, dt, name);
  const MPI_Datatype type = half && !widen ? (dt == kBFloat16 ? g_bf16_type : g_f16_type) : mpi_type(widen ? kFloat32 : dt, name);
  Tensor buf = widen ? t.to(kFloat32) : t;
  const bool predivide = average && half && !widen;  // each rank's share first: the sum stays in range
  if (predivide) {
    NoGradGuard ng;
    buf.mul_(1.0 / size_);
  }
  std::function<int(void*)> start;
  if (buf.numel() > 0) {
    start = [this, buf, type, mop](void* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, buf.raw_data(), int(buf.numel()), type, mop, impl_->comm,
                            static_cast<MPI_Request*>(r));
    };
  }
  const double scale = average && !predivide ? 1.0 / size_ : 1.0;
  return submit(name, std::move(start), [t, buf, widen, scale] {
    if (scale != 1.0) Tensor(buf).mul_(scale);
    if (widen) Tensor(t).copy_(buf);
    else ampgrad::detail::bump_version(t);
  });
}

void ProcessGroup::broadcast(const Tensor& t, int src) {
  const char* name = "broadcast";
  const bool cuda = check_tensor(t, name);
  AG_CHECK(src >= 0 && src < size_, name, "the source rank must be in [0, ", size_, "), got ", src);
  if (t.numel() == 0) return;
  if (cuda) return detail::nccl_broadcast(*this, t, src);
  const int64_t count = t.numel();
  AG_CHECK(count < (int64_t(1) << 31), name, "tensors of more than 2^31 - 1 elements are not supported, got ", count);
  const MPI_Datatype type = mpi_type(t.dtype(), name);
  submit(
      name,
      [this, t, count, type, src](void* r) {
        return MPI_Ibcast(t.raw_data(), int(count), type, src, impl_->comm, static_cast<MPI_Request*>(r));
      },
      [t] { ampgrad::detail::bump_version(t); })
      .wait();
}

Tensor ProcessGroup::all_gather(const Tensor& t) {
  const char* name = "all_gather";
  const bool cuda = check_tensor(t, name);
  Shape out_shape = t.sizes();
  if (out_shape.empty()) out_shape = {int64_t(size_)};
  else out_shape[0] *= size_;
  if (cuda && t.numel() > 0) return detail::nccl_all_gather(*this, t, out_shape);
  Tensor out = make_tensor(out_shape, t.dtype(), t.device(), name);
  const int64_t count = t.numel();
  AG_CHECK(count * size_ < (int64_t(1) << 31), name, "results of more than 2^31 - 1 elements are not supported");
  if (count == 0) return out;
  const MPI_Datatype mt = mpi_type(t.dtype(), name);
  submit(
      name,
      [this, t, out, count, mt](void* r) {
        return MPI_Iallgather(t.raw_data(), int(count), mt, out.raw_data(), int(count), mt, impl_->comm,
                              static_cast<MPI_Request*>(r));
      },
      nullptr)
      .wait();
  return out;
}

#else  // no MPI in this build: a job of one process (CUDA tensors still go through NCCL)

bool built_with_mpi() { return false; }

struct ProcessGroup::Impl {};
ProcessGroup::ProcessGroup() : impl_(std::make_unique<Impl>()) { timeout_ = timeout_from_env(); }
ProcessGroup::~ProcessGroup() = default;

ProcessGroup& ProcessGroup::world() {
  // Several processes that each believed to be the whole job would train apart, silently.
  AG_CHECK(!launched_by_mpi(), "dist", "an MPI launcher started this process, but this build has no MPI "
           "(install libopenmpi-dev and configure with AMPGRAD_MPI=ON)");
  static ProcessGroup* pg = new ProcessGroup();
  return *pg;
}

void ProcessGroup::barrier() {}

Work ProcessGroup::all_reduce_async(const Tensor& t, ReduceOp op, bool reduce_in_half) {
  const char* name = "all_reduce";
  const bool cuda = check_tensor(t, name);
  AG_CHECK(op != ReduceOp::Avg || t.is_floating_point(), name, "avg needs a floating tensor, got ",
           dtype_name(t.dtype()));
  if (cuda && t.numel() > 0) return detail::nccl_all_reduce(*this, t, op, reduce_in_half);
  return detail::completed_work(nullptr);  // one rank: the tensor is the result
}

void ProcessGroup::broadcast(const Tensor& t, int src) {
  const char* name = "broadcast";
  const bool cuda = check_tensor(t, name);
  AG_CHECK(src == 0, name, "the source rank must be in [0, 1), got ", src);
  if (cuda && t.numel() > 0) detail::nccl_broadcast(*this, t, src);
}

Tensor ProcessGroup::all_gather(const Tensor& t) {
  const char* name = "all_gather";
  const bool cuda = check_tensor(t, name);
  const Shape out_shape = t.sizes().empty() ? Shape{1} : t.sizes();
  if (cuda && t.numel() > 0) return detail::nccl_all_gather(*this, t, out_shape);
  return t.reshape(out_shape).clone();
}

#endif

}  // namespace ampgrad::dist
