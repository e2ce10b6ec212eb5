// The process group's collectives on CUDA tensors, through NCCL (distributed.h).
//
// One communicator per process (a process of a job drives one GPU), made on first use:
// rank 0 asks NCCL for a unique id and the group broadcasts it over MPI, then every rank
// joins with ncclCommInitRank. Collectives run on a stream of their own, so that a
// reduction started during backward overlaps the kernels still queued on the caller's
// stream: an event makes the NCCL stream wait for the caller's work on the tensor, and
// Work::wait() makes the caller's stream wait for the NCCL stream. Neither waits on the
// host; the tensor's memory is kept (record_stream) until the NCCL stream is done with it.
// float16 and bfloat16 are reduced in float32 unless reduce_in_half; averages are NCCL's
// own (ncclAvg).
#include "dist_internal.h"

#if AMPGRAD_WITH_NCCL

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "ampgrad/autograd.h"
#include "ampgrad/backend.h"
#include "ampgrad/factories.h"
#include "ampgrad/stream.h"

namespace ampgrad::dist {

bool built_with_nccl() { return true; }

namespace detail {
namespace {

void check_nccl(ncclResult_t r, const char* op, const char* what) {
  if (r != ncclSuccess) AG_ERROR(op, what, " failed: ", ncclGetErrorString(r));
}

ncclDataType_t nccl_type(DType d, const char* op) {
  switch (d) {
    case kFloat32: return ncclFloat32;
    case kFloat64: return ncclFloat64;
    case kFloat16: return ncclFloat16;
    case kBFloat16: return ncclBfloat16;
    case kInt64: return ncclInt64;
    case kInt32: return ncclInt32;
    case kUInt8:
    case kBool: return ncclUint8;
  }
  // Every dtype is listed above: only a value outside the enum reaches this line, so it is
  // printed as a number (dtype_name would index past its table).
  AG_ERROR(op, "no NCCL type for dtype number ", int(d));
}

ncclRedOp_t nccl_op(ReduceOp op, DType d, const char* name) {
  if (d == kBool) {
    AG_CHECK(op != ReduceOp::Avg, name, "avg of a bool tensor is not defined");
    return op == ReduceOp::Min ? ncclMin : ncclMax;  // sum and max: any; min: all
  }
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

struct Communicator {
  int device = -1;
  ncclComm_t comm = nullptr;
  Stream stream;
};

std::mutex g_mu;
Communicator g_comm;

// At exit, before the CUDA runtime's own teardown (registered earlier, so run later):
// NCCL's resources (its proxy thread, device buffers, connections to the other ranks) are
// released, after the collectives still queued finish. In an MPI build this also runs
// before MPI_Finalize (atexit order again).
void destroy_communicator() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_comm.comm == nullptr) return;
  ncclCommDestroy(g_comm.comm);
  g_comm.comm = nullptr;
}

Communicator& communicator(ProcessGroup& group, Device device, const char* op) {
  Communicator& c = g_comm;
  std::lock_guard<std::mutex> lock(g_mu);
  if (c.comm != nullptr) {
    AG_CHECK(c.device == device.index, op, "this process's NCCL communicator is on cuda:", c.device,
             " (a process of the job drives one GPU), got a tensor on ", device);
    return c;
  }
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (group.rank() == 0) check_nccl(ncclGetUniqueId(&id), op, "ncclGetUniqueId");
  Tensor bytes = zeros({int64_t(sizeof id)}, kUInt8);
  std::memcpy(bytes.raw_data(), &id, sizeof id);
  group.broadcast(bytes, 0);  // over MPI: every rank joins rank 0's communicator
  std::memcpy(&id, bytes.raw_data(), sizeof id);
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device.index);
  const ncclResult_t r = ncclCommInitRank(&c.comm, group.size(), id, group.rank());
  cudaSetDevice(previous);
  check_nccl(r, op, "ncclCommInitRank");
  c.device = device.index;
  c.stream = create_stream(device);
  std::atexit(destroy_communicator);
  return c;
}

cudaStream_t cuda_stream(Stream s) { return static_cast<cudaStream_t>(stream_handle(s)); }

// Runs `call` on the communicator's stream after the caller's work so far; returns the
// event that marks its end there.
template <class Call>
std::shared_ptr<Event> on_nccl_stream(const Communicator& c, Device device, const std::vector<Tensor>& used,
                                      const Call& call) {
  Event ready(device, /*enable_timing=*/false);
  ready.record();  // the caller's current stream: the inputs are written
  ready.wait(c.stream);
  for (const Tensor& t : used) record_stream(t, c.stream);
  call(cuda_stream(c.stream));
  auto done = std::make_shared<Event>(device, false);
  done->record(c.stream);
  return done;
}

}  // namespace

Work nccl_all_reduce(ProcessGroup& group, const Tensor& t, ReduceOp op, bool reduce_in_half) {
  const char* name = "all_reduce";
  const Communicator& c = communicator(group, t.device(), name);
  const bool widen = is_reduced_floating(t.dtype()) && !reduce_in_half;
  const Tensor buf = widen ? t.to(kFloat32) : t;  // on the caller's stream
  const ncclDataType_t type = nccl_type(buf.dtype(), name);
  const ncclRedOp_t rop = nccl_op(op, t.dtype(), name);
  auto done = on_nccl_stream(c, t.device(), {buf}, [&](cudaStream_t s) {
    check_nccl(ncclAllReduce(buf.raw_data(), buf.raw_data(), size_t(buf.numel()), type, rop, c.comm, s), name,
               "ncclAllReduce");
  });
  return completed_work([t, buf, widen, done] {
    done->wait();  // the caller's stream waits for the reduction; the host does not
    if (widen) Tensor(t).copy_(buf);
    else ampgrad::detail::bump_version(t);
  });
}

void nccl_broadcast(ProcessGroup& group, const Tensor& t, int src) {
  const char* name = "broadcast";
  const Communicator& c = communicator(group, t.device(), name);
  const ncclDataType_t type = nccl_type(t.dtype(), name);
  auto done = on_nccl_stream(c, t.device(), {t}, [&](cudaStream_t s) {
    check_nccl(ncclBroadcast(t.raw_data(), t.raw_data(), size_t(t.numel()), type, src, c.comm, s), name,
               "ncclBroadcast");
  });
  done->wait();
  ampgrad::detail::bump_version(t);
}

Tensor nccl_all_gather(ProcessGroup& group, const Tensor& t, const Shape& out_shape) {
  const char* name = "all_gather";
  const Communicator& c = communicator(group, t.device(), name);
  Tensor out = empty(out_shape, TensorOptions().dtype(t.dtype()).device(t.device()));
  const ncclDataType_t type = nccl_type(t.dtype(), name);
  auto done = on_nccl_stream(c, t.device(), {t, out}, [&](cudaStream_t s) {
    check_nccl(ncclAllGather(t.raw_data(), out.raw_data(), size_t(t.numel()), type, c.comm, s), name,
               "ncclAllGather");
  });
  done->wait();
  return out;
}

}  // namespace detail
}  // namespace ampgrad::dist

#else  // no NCCL in this build

namespace ampgrad::dist {
bool built_with_nccl() { return false; }

namespace detail {
// Never reached: the process group refuses CUDA tensors before it gets here.
Work nccl_all_reduce(ProcessGroup&, const Tensor&, ReduceOp, bool) { AG_ERROR("all_reduce", "this build has no NCCL"); }
void nccl_broadcast(ProcessGroup&, const Tensor&, int) { AG_ERROR("broadcast", "this build has no NCCL"); }
Tensor nccl_all_gather(ProcessGroup&, const Tensor&, const Shape&) { AG_ERROR("all_gather", "this build has no NCCL"); }
}  // namespace detail
}  // namespace ampgrad::dist

#endif
