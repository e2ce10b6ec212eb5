// GradReducer (distributed.h): bucketed gradient averaging started from gradient hooks.
//
// The hooks hold the state weakly: parameters may outlive the reducer (a model kept after
// its Lite is gone), and a hook of a dead reducer does nothing.
#include <algorithm>
#include <optional>

#include "ampgrad/autograd.h"
#include "ampgrad/ops/shape.h"
#include "ampgrad/dist/distributed.h"

namespace ampgrad::dist {

struct GradReducer::State {
  ProcessGroup* group = nullptr;
  ReducerOptions options;
  std::vector<Tensor> params;  // registration order
  struct Bucket {
    std::vector<size_t> members;  // indices into params, in reverse registration order
    int pending = 0;              // gradients still to arrive in this pass
    Tensor flat;                  // the members' gradients side by side (several members)
    std::optional<Work> work;
  };
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;  // per parameter
  std::vector<char> arrived;      // per parameter, this pass
  size_t next_launch = 0;         // buckets start in index order on every rank
  bool armed = false;

  void launch(Bucket& b) {
    NoGradGuard ng;
    const bool in_half = options.reduce_in_half;
    // The reduced values are written back into the gradients in place: each must own dense
    // memory (a gradient set by the user may be any view, an expanded one included).
    for (size_t i : b.members) {
      const Tensor g = params[i].grad();
      if (!g.is_contiguous()) params[i].set_grad(g.contiguous());
    }
    if (b.members.size() == 1) {
      const Tensor g = params[b.members.front()].grad();
      b.work = group->all_reduce_async(g, ReduceOp::Avg, in_half);  // reduced where it lies
      return;
    }
    std::vector<Tensor> flat;
    for (size_t i : b.members) {
      const Tensor g = params[i].grad();
      flat.push_back(reshape(g, {g.numel()}));
    }
    b.flat = cat(flat);
    b.work = group->all_reduce_async(b.flat, ReduceOp::Avg, in_half);
  }

  void launch_ready() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) launch(buckets[next_launch++]);
  }

  void arrive(size_t i) {
    if (!armed || arrived[i]) return;
    arrived[i] = 1;
    if (--buckets[bucket_of[i]].pending == 0 && options.overlap) launch_ready();
  }

  // Waits for every bucket started and forgets the pass (after an error too).
  void drain(bool copy_back) {
    std::exception_ptr first;
    for (Bucket& b : buckets) {
      if (!b.work) continue;
      try {
        b.work->wait();
        if (copy_back && b.flat.defined()) {
          NoGradGuard ng;
          int64_t at = 0;
          for (size_t i : b.members) {
            const Tensor g = params[i].grad();
            Tensor(g).copy_(reshape(narrow(b.flat, 0, at, g.numel()), g.sizes()));
            at += g.numel();
          }
        }
      } catch (...) {
        if (!first) first = std::current_exception();
      }
      b.work.reset();
      b.flat = Tensor();
    }
    armed = false;
    if (first) std::rethrow_exception(first);
  }
};

GradReducer::GradReducer(ProcessGroup& group, ReducerOptions options) : state_(std::make_shared<State>()) {
  AG_CHECK(options.bucket_bytes > 0, "GradReducer", "bucket_bytes must be positive, got ", options.bucket_bytes);
  state_->group = &group;
  state_->options = options;
}

GradReducer::~GradReducer() = default;

void GradReducer::add_parameters(const std::vector<Tensor>& params) {
  State& s = *state_;
  AG_CHECK(!s.armed, "GradReducer", "add_parameters() during a backward pass (between prepare() and finish())");
  for (const Tensor& p : params) {
    AG_CHECK(p.defined() && p.is_leaf() && p.requires_grad(), "GradReducer",
             "parameters must be leaves that require grad, got one of shape ", p.defined() ? p.sizes() : Shape{});
    const bool known = std::any_of(s.params.begin(), s.params.end(),
                                   [&](const Tensor& q) { return q.unsafe_impl() == p.unsafe_impl(); });
    if (known) continue;
    const size_t index = s.params.size();
    s.params.push_back(p);
    std::weak_ptr<State> weak = state_;
    p.register_post_accumulate_grad_hook([weak, index](const Tensor&) {
      if (auto st = weak.lock()) st->arrive(index);
    });
  }
  // Buckets from the last parameter registered: the first whose gradient is complete.
  s.buckets.clear();
  s.bucket_of.assign(s.params.size(), 0);
  s.arrived.assign(s.params.size(), 0);
  int64_t bytes = 0;
  for (size_t k = s.params.size(); k-- > 0;) {
    const Tensor& p = s.params[k];
    const int64_t nbytes = p.numel() * int64_t(itemsize(p.dtype()));
    const bool fits = !s.buckets.empty() && s.params[s.buckets.back().members.front()].dtype() == p.dtype() &&
                      bytes < s.options.bucket_bytes;
    if (!fits) {
      s.buckets.emplace_back();
      bytes = 0;
    }
    s.buckets.back().members.push_back(k);
    s.bucket_of[k] = s.buckets.size() - 1;
    bytes += nbytes;
  }
}

void GradReducer::prepare() {
  State& s = *state_;
  s.drain(false);  // a pass that ended in an error: its reductions still finish in order
  for (State::Bucket& b : s.buckets) b.pending = int(b.members.size());
  std::fill(s.arrived.begin(), s.arrived.end(), 0);
  s.next_launch = 0;
  s.armed = true;  // a job of one reduces too (a copy): the same path at every size
}

void GradReducer::finish() {
  State& s = *state_;
  if (!s.armed) return;
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (s.arrived[i]) continue;
    s.drain(false);
    AG_ERROR("GradReducer", "parameter ", i, " (shape ", s.params[i].sizes(), ") got no gradient on rank ",
             s.group->rank(), " in this backward pass: every rank must compute every parameter's gradient "
             "(the averaging would wait for it on the other ranks)");
  }
  s.launch_ready();
  s.drain(true);
}

size_t GradReducer::num_parameters() const { return state_->params.size(); }
size_t GradReducer::num_buckets() const { return state_->buckets.size(); }
size_t GradReducer::buckets_started() const { return state_->next_launch; }
const ReducerOptions& GradReducer::options() const { return state_->options; }

}  // namespace ampgrad::dist
