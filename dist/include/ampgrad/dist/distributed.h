// The processes of a data-parallel job, and the collectives between them, over MPI.
//
//   mpirun -np 2 ./train                      # one process per device, on one machine or several
//
//   auto& pg = ag::dist::ProcessGroup::world();   // joins the job (MPI_Init on first use)
//   pg.all_reduce(grad, ag::dist::ReduceOp::Avg); // in place, on every rank
//   pg.broadcast(param, 0);                        // rank 0's values everywhere
//
// Processes are started by an MPI launcher (OpenMPI's mpirun); rank, world size and the
// rank within the machine come from MPI. A process started without one is a job of one.
// Collectives take contiguous tensors: CPU tensors go through MPI's own algorithms, CUDA
// tensors through NCCL (when the build has it) on a stream of the group's, ordered after
// the caller's stream and before its later work without host waits. float16 and bfloat16
// are reduced in float32 and rounded once, unless the caller asks to reduce them in their
// own type (half the bytes on the wire). all_reduce_async starts a reduction and returns
// at once: a thread of the group drives it while the caller computes (Lite's "ddp"
// reduces gradient buckets this way during backward), and the returned Work's wait()
// finishes it. Every collective waits at most timeout() (AMPGRAD_DIST_TIMEOUT seconds,
// default 300): past it the ranks that are still there find out which ranks never reached
// the collective and throw an ag::Error naming them, so that a process that died or hangs
// ends the job instead of leaving the others waiting forever. After such an error the
// group is unusable. docs/distributed.md has the launch recipes and the failure model.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "ampgrad/tensor.h"

namespace ampgrad::dist {

enum class ReduceOp { Sum, Avg, Max, Min };
/// "sum", "avg", "max", "min".
const char* reduce_op_name(ReduceOp op);

/// Whether this build has MPI (CMake found it; AMPGRAD_MPI=ON, the default).
bool built_with_mpi();
/// Whether this build has NCCL for CUDA tensors (the CUDA backend is built and CMake found
/// nccl.h and libnccl beside the CUDA toolkit).
bool built_with_nccl();
/// Whether an MPI launcher started this process (its environment says so), so that
/// world() joins a job of several processes.
bool launched_by_mpi();

/// A collective started by ProcessGroup::all_reduce_async. It must be waited for, by one
/// thread; collectives run in the order they were started, on every rank.
class Work {
 public:
  /// Blocks until the collective has completed on this rank, then finishes it on this
  /// thread (the division of an average, the rounding of a 16-bit result) and returns;
  /// the tensor holds the result from here on. Rethrows the collective's ag::Error.
  void wait();
  /// Whether the collective itself is over (wait() is still needed to finish it).
  bool completed() const;

  struct State;
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<State> state_;
};

/// All the processes of the job (MPI_COMM_WORLD). Calls from several threads are
/// serialised; every rank must call the same collectives in the same order.
class ProcessGroup {
 public:
  /// The job's group: MPI is initialised on the first call (and finalised at exit, unless
  /// the program had initialised it itself). A build without MPI is a job of one process
  /// (its CUDA collectives still run through NCCL), and an ag::Error when an MPI launcher
  /// started it.
  static ProcessGroup& world();

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// The rank among the processes on this machine, and their number.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  bool is_global_zero() const { return rank_ == 0; }

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t);

  /// Waits until every rank has called barrier().
  void barrier();
  /// t = op over the ranks' t, in place on every rank (Avg: floating dtypes only).
  /// float16 and bfloat16 are reduced in float32 and rounded once; reduce_in_half keeps
  /// them in their own type on the wire and in the sums (an average divides each rank's
  /// values first, so the sum stays in range), at half the bytes.
  void all_reduce(const Tensor& t, ReduceOp op, bool reduce_in_half = false) {
    all_reduce_async(t, op, reduce_in_half).wait();
  }
  /// all_reduce, started and not waited for: t must not be read or written until the
  /// returned Work's wait() has returned.
  Work all_reduce_async(const Tensor& t, ReduceOp op, bool reduce_in_half = false);
  /// t = rank src's t, in place on every rank.
  void broadcast(const Tensor& t, int src);
  /// The ranks' t concatenated along dim 0 in rank order ([size] for 0-dim tensors); every
  /// rank passes the same shape and dtype.
  Tensor all_gather(const Tensor& t);

  /// Collectives this process has completed (diagnostics and tests).
  int64_t calls() const { return calls_.load(); }

  struct Impl;
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

 private:
  ProcessGroup();
  /// Queues a collective (start: the MPI call, given an MPI_Request*; null for nothing to
  /// send; finish: run by Work::wait on the waiting thread).
  Work submit(const char* op, std::function<int(void*)> start, std::function<void()> finish);
  void execute(Work::State& w);
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::chrono::milliseconds timeout_{300000};
  std::atomic<int64_t> calls_{0};
};

/// How GradReducer (and Lite's "ddp") averages gradients.
struct ReducerOptions {
  /// Gradients are reduced in flat buckets of about this many bytes (one dtype each).
  int64_t bucket_bytes = int64_t(25) << 20;
  /// Start each bucket's reduction during backward, as soon as its last gradient is
  /// accumulated (false: all of them after backward; the benchmark's baseline).
  bool overlap = true;
  /// Reduce float16 and bfloat16 gradients in their own type (half the bytes; the sums
  /// round at every step) instead of float32.
  bool reduce_in_half = false;
};

/// Averages the gradients of a set of parameters over the ranks of a group, the way
/// PyTorch's DistributedDataParallel does: the parameters are split into buckets in
/// reverse registration order (the order backward finishes their gradients), a hook on
/// each parameter counts the gradients accumulated, and a full bucket starts its
/// reduction (all_reduce_async) while backward goes on. Buckets start in the same order on
/// every rank, whatever order their gradients arrive in. Every rank must compute a
/// gradient for every parameter in every backward pass between prepare() and finish().
///
///   reducer.add_parameters(model.parameters());   // once, the same on every rank
///   reducer.prepare(); loss.backward(); reducer.finish();   // grads are now averages
class GradReducer {
 public:
  GradReducer(ProcessGroup& group, ReducerOptions options = {});
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  /// Adds leaves that require grad (ones already added are skipped) and rebuilds the
  /// buckets. Not during a backward pass.
  void add_parameters(const std::vector<Tensor>& params);
  /// Arms the hooks for the next backward pass.
  void prepare();
  /// After backward: starts any bucket not started yet, waits for every reduction and
  /// writes the averages into the gradients. An ag::Error names a parameter that got no
  /// gradient on this rank (the other ranks would wait for it).
  void finish();

  size_t num_parameters() const;
  size_t num_buckets() const;
  /// Buckets whose reduction has started in the current pass (tests: the overlap).
  size_t buckets_started() const;
  const ReducerOptions& options() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace ampgrad::dist
