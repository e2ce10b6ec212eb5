// ProcessGroup over MPI (distributed.h).
//
// Every collective is MPI's non-blocking form, waited for by polling MPI_Test against a
// deadline, so that a missing rank turns into an error instead of a hang. On the deadline
// each waiting rank sends the number of the collective it waits in to every other rank on
// a second communicator and listens for a grace period: a rank that sends nothing (or a
// lower number) did not reach the collective, and the error names it. MPI_ERRORS_RETURN on
// both communicators turns MPI's failures into ag::Error as well. float16 and bfloat16
// reductions go through a float32 copy.
#include "ampgrad/wrappers/distributed.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ampgrad/autograd.h"
#include "ampgrad/factories.h"

#if AMPGRAD_WITH_MPI
#include <mpi.h>
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

void check_tensor(const Tensor& t, const char* op) {
  AG_CHECK(t.defined(), op, "the tensor is undefined");
  AG_CHECK(t.device().type == kCPU, op, "expected a CPU tensor (CUDA tensors need the NCCL backend, not built), got ",
           t.device());
  AG_CHECK(t.is_contiguous(), op, "expected a contiguous tensor, got shape ", t.sizes(), " with strides ", t.strides());
}
}  // namespace

void ProcessGroup::set_timeout(std::chrono::milliseconds t) {
  AG_CHECK(t.count() > 0, "dist", "the timeout must be positive, got ", t.count(), " ms");
  timeout_ = t;
}

#if AMPGRAD_WITH_MPI

bool built_with_mpi() { return true; }

struct ProcessGroup::Impl {
  MPI_Comm comm = MPI_COMM_NULL, diag = MPI_COMM_NULL;
  bool finalize = false;
  std::mutex mu;
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

}  // namespace

ProcessGroup::ProcessGroup() : impl_(std::make_unique<Impl>()) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "dist", "MPI_Init_thread");
    impl_->finalize = true;
  }
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
  timeout_ = timeout_from_env();
}

ProcessGroup::~ProcessGroup() = default;

namespace {
ProcessGroup::Impl* g_world = nullptr;

// At exit: MPI_Finalize, which waits for every rank; after a timeout some rank may never
// get there, so a broken group ends the whole job with MPI_Abort instead.
void finish_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (g_world != nullptr && !g_world->broken.empty()) MPI_Abort(MPI_COMM_WORLD, 3);
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
          std::chrono::milliseconds timeout, const char* op) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  for (int spins = 0;; ++spins) {
    int done = 0;
    check_mpi(MPI_Test(&req, &done, MPI_STATUS_IGNORE), op, "waiting for the other ranks");
    if (done) return;
    if (Clock::now() >= deadline) break;
    // Poll hard at first (a collective between processes on one machine takes
    // microseconds), then let other processes run: ranks often share cores.
    if (spins > 2000) std::this_thread::sleep_for(std::chrono::microseconds(spins > 20000 ? 1000 : 50));
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
  impl.broken = why.str();
  AG_ERROR(op, why.str());
}

}  // namespace

namespace {
// Runs one non-blocking collective under the group's lock and deadline.
template <class Start>
void run(ProcessGroup::Impl& impl, int64_t& calls, int rank, int size, std::chrono::milliseconds timeout,
         const char* op, const Start& start) {
  std::lock_guard<std::mutex> lock(impl.mu);
  AG_CHECK(impl.broken.empty(), op, "the process group is unusable after an earlier error: ", impl.broken);
  MPI_Request req = MPI_REQUEST_NULL;
  check_mpi(start(&req), op, "starting the collective");
  wait(impl, req, calls, rank, size, timeout, op);
  ++calls;
}
}  // namespace

void ProcessGroup::barrier() {
  run(*impl_, calls_, rank_, size_, timeout_, "barrier", [&](MPI_Request* r) { return MPI_Ibarrier(impl_->comm, r); });
}

void ProcessGroup::all_reduce(const Tensor& t, ReduceOp op) {
  const char* name = "all_reduce";
  check_tensor(t, name);
  const DType dt = t.dtype();
  AG_CHECK(op != ReduceOp::Avg || t.is_floating_point(), name, "avg needs a floating tensor, got ",
           dtype_name(dt));
  const bool half = dt == kFloat16 || dt == kBFloat16;
  Tensor buf = half ? t.to(kFloat32) : t;  // 16-bit: reduced in float32, rounded once
  const MPI_Op mop = mpi_op(op, dt, name);
  AG_CHECK(buf.numel() < (int64_t(1) << 31), name, "tensors of more than 2^31 - 1 elements are not supported, got ",
           buf.numel());
  if (buf.numel() > 0) {
    run(*impl_, calls_, rank_, size_, timeout_, name, [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, buf.raw_data(), int(buf.numel()), mpi_type(buf.dtype(), name), mop,
                            impl_->comm, r);
    });
  }
  if (op == ReduceOp::Avg && size_ > 1) {
    NoGradGuard ng;
    buf.mul_(1.0 / size_);
  }
  if (half) {
    NoGradGuard ng;
    Tensor(t).copy_(buf);
  } else {
    detail::bump_version(t);
  }
}

void ProcessGroup::broadcast(const Tensor& t, int src) {
  const char* name = "broadcast";
  check_tensor(t, name);
  AG_CHECK(src >= 0 && src < size_, name, "the source rank must be in [0, ", size_, "), got ", src);
  if (t.numel() == 0) return;
  const int64_t count = t.numel();
  AG_CHECK(count < (int64_t(1) << 31), name, "tensors of more than 2^31 - 1 elements are not supported, got ", count);
  run(*impl_, calls_, rank_, size_, timeout_, name, [&](MPI_Request* r) {
    return MPI_Ibcast(t.raw_data(), int(count), mpi_type(t.dtype(), name), src, impl_->comm, r);
  });
  detail::bump_version(t);
}

Tensor ProcessGroup::all_gather(const Tensor& t) {
  const char* name = "all_gather";
  check_tensor(t, name);
  Shape out_shape = t.sizes();
  if (out_shape.empty()) out_shape = {int64_t(size_)};
  else out_shape[0] *= size_;
  Tensor out = make_tensor(out_shape, t.dtype(), t.device(), name);
  const int64_t count = t.numel();
  AG_CHECK(count * size_ < (int64_t(1) << 31), name, "results of more than 2^31 - 1 elements are not supported");
  if (count == 0) return out;
  run(*impl_, calls_, rank_, size_, timeout_, name, [&](MPI_Request* r) {
    const MPI_Datatype mt = mpi_type(t.dtype(), name);
    return MPI_Iallgather(t.raw_data(), int(count), mt, out.raw_data(), int(count), mt, impl_->comm, r);
  });
  return out;
}

#else  // no MPI in this build

bool built_with_mpi() { return false; }

struct ProcessGroup::Impl {};
ProcessGroup::ProcessGroup() = default;
ProcessGroup::~ProcessGroup() = default;
ProcessGroup& ProcessGroup::world() {
  AG_ERROR("dist", "this build has no MPI (install libopenmpi-dev and configure with AMPGRAD_MPI=ON)");
}
void ProcessGroup::barrier() {}
void ProcessGroup::all_reduce(const Tensor&, ReduceOp) {}
void ProcessGroup::broadcast(const Tensor&, int) {}
Tensor ProcessGroup::all_gather(const Tensor& t) { return t; }

#endif

}  // namespace ampgrad::dist
