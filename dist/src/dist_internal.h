// Between the process group (distributed.cpp, MPI) and its NCCL half (nccl.cpp).
#pragma once

#include <functional>

#include "ampgrad/dist/distributed.h"

namespace ampgrad::dist::detail {

/// A Work with nothing left to wait for on the host: wait() runs `finish` (NCCL's work is
/// ordered on the device's streams, so finishing it queues more there).
Work completed_work(std::function<void()> finish);

// CUDA tensors, through the job's NCCL communicator (made on first use: rank 0's NCCL
// unique id is broadcast over MPI). Defined only when the build has NCCL.
Work nccl_all_reduce(ProcessGroup& group, const Tensor& t, ReduceOp op, bool reduce_in_half);
void nccl_broadcast(ProcessGroup& group, const Tensor& t, int src);
Tensor nccl_all_gather(ProcessGroup& group, const Tensor& t, const Shape& out_shape);

}  // namespace ampgrad::dist::detail
