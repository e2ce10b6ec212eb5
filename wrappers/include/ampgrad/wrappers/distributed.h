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
// Collectives take contiguous CPU tensors (CUDA tensors go through NCCL, not built yet)
// and run MPI's own algorithms; float16 and bfloat16 are reduced in float32 and rounded
// once. Every collective waits at most timeout() (AMPGRAD_DIST_TIMEOUT seconds, default
// 300): past it the ranks that are still there find out which ranks never reached the
// collective and throw an ag::Error naming them, so that a process that died or hangs
// ends the job instead of leaving the others waiting forever. After such an error the
// group is unusable. docs/distributed.md has the launch recipes and the failure model.
#pragma once

#include <chrono>
#include <memory>

#include "ampgrad/tensor.h"

namespace ampgrad::dist {

enum class ReduceOp { Sum, Avg, Max, Min };
/// "sum", "avg", "max", "min".
const char* reduce_op_name(ReduceOp op);

/// Whether this build has MPI (CMake found it; AMPGRAD_MPI=ON, the default).
bool built_with_mpi();
/// Whether an MPI launcher started this process (its environment says so), so that
/// world() joins a job of several processes.
bool launched_by_mpi();

/// All the processes of the job (MPI_COMM_WORLD). Calls from several threads are
/// serialised; every rank must call the same collectives in the same order.
class ProcessGroup {
 public:
  /// The job's group: MPI is initialised on the first call (and finalised at exit, unless
  /// the program had initialised it itself). Without MPI in the build, an ag::Error.
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
  void all_reduce(const Tensor& t, ReduceOp op);
  /// t = rank src's t, in place on every rank.
  void broadcast(const Tensor& t, int src);
  /// The ranks' t concatenated along dim 0 in rank order ([size] for 0-dim tensors); every
  /// rank passes the same shape and dtype.
  Tensor all_gather(const Tensor& t);

  /// Collectives this process has completed (diagnostics and tests).
  int64_t calls() const { return calls_; }

  struct Impl;
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

 private:
  ProcessGroup();
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::chrono::milliseconds timeout_{300000};
  int64_t calls_ = 0;
};

}  // namespace ampgrad::dist
