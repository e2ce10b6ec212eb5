// The autograd engine and the autograd side of Tensor.
#include "ampgrad/autograd.h"

#include <atomic>
#include <sstream>
#include <cctype>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "ampgrad/dispatch.h"
#include "ampgrad/factories.h"
#include "ampgrad/ops/elementwise.h"
#include "ampgrad/ops/reduce.h"
#include "ampgrad/ops/shape.h"

namespace ampgrad {

namespace {
thread_local bool t_grad_enabled = true;
std::atomic<uint64_t> g_sequence_nr{0};

// Thrown by SavedTensor::get; FunctionNode::apply adds the node's name.
struct SavedTensorModified : Error {
  using Error::Error;
};

std::string backward_name(const char* op) {
  std::string s;
  bool up = true;
  for (const char* c = op; *c; ++c) {
    if (*c == '_') {
      up = true;
      continue;
    }
    s += up ? char(std::toupper(static_cast<unsigned char>(*c))) : *c;
    up = false;
  }
  return s + "Backward";
}
}  // namespace

bool GradMode::is_enabled() { return t_grad_enabled; }
void GradMode::set_enabled(bool enabled) { t_grad_enabled = enabled; }

Node::Node() : sequence_nr(g_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

SavedTensor::SavedTensor(const Tensor& t) {
  if (t.defined()) {
    data_ = t.detach();
    version_ = t.version();
  }
}

const Tensor& SavedTensor::get() const {
  if (data_.defined() && data_.version() != version_) {
    std::ostringstream os;
    os << "a tensor saved for backward (shape " << data_.sizes() << ", " << dtype_name(data_.dtype())
       << ") was modified by an in-place operation: saved at version " << version_
       << ", now at version " << data_.version()
       << "; use an out-of-place op or clone the tensor before modifying it";
    throw SavedTensorModified(os.str());
  }
  return data_;
}

TensorList FunctionNode::apply(TensorList&& grad_outputs) {
  AG_CHECK(!released_, "backward", "trying to backward through the graph a second time: ", name_,
           " has already freed its saved tensors; pass retain_graph=true to the first backward call");
  bool any = false;
  for (const Tensor& g : grad_outputs) any = any || g.defined();
  if (!any) return TensorList(next_edges.size());
  try {
    return fn_(grad_outputs, GradMask(next_edges));
  } catch (const SavedTensorModified& e) {
    throw Error("[" + name_ + "] " + e.what());
  }
}

void FunctionNode::release() {
  fn_ = nullptr;
  released_ = true;
}

namespace {
// Whether dst += src can write into dst's memory: every element of dst is its own (dense,
// no two indices on one element, which an expanded view breaks) and the sum keeps dst's
// shape, device and dtype. Who else may see dst is the caller's question.
bool can_add_in_place(const Tensor& dst, const Tensor& src) {
  return dst.sizes() == src.sizes() && dst.device() == src.device() &&
         promote_types(dst.dtype(), src.dtype()) == dst.dtype() && !dst.requires_grad() &&
         dst.is_non_overlapping_and_dense();
}
}  // namespace

AccumulateGrad::AccumulateGrad(Tensor leaf) : leaf_(std::move(leaf)) {
  input_meta.push_back({leaf_.sizes(), leaf_.dtype(), leaf_.device(), std::nullopt});
}

TensorList AccumulateGrad::apply(TensorList&& grad_outputs) {
  Tensor g = std::move(grad_outputs[0]);
  if (!g.defined()) return {};
  AutogradMeta& meta = leaf_.unsafe_impl()->meta();
  for (const auto& hook : meta.hooks) {
    Tensor r = hook(g);
    if (r.defined()) g = std::move(r);
  }
  if (!meta.grad.defined()) {
    // Keep the incoming tensor when nothing else can see it; otherwise own a copy, so that
    // later in-place accumulation never writes into another tensor's memory.
    const bool unshared = g.impl_ptr().use_count() == 1 &&
                          g.unsafe_impl()->storage.use_count() == 1 && g.is_contiguous();
    meta.grad = unshared ? g : g.clone();
  } else if (can_add_in_place(meta.grad, g)) {
    meta.grad.add_(g);  // as PyTorch does: a handle the user holds on .grad sees the sum
  } else {
    meta.grad = add(meta.grad, g);  // e.g. a .grad set to an expanded view: new memory
  }
  for (const auto& hook : meta.post_accumulate_hooks) hook(leaf_);
  return {};
}

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

bool any_requires_grad(const TensorList& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Edge gradient_edge(const Tensor& t) {
  TensorImpl* impl = t.unsafe_impl();
  if (!impl->autograd) return {};
  AutogradMeta& m = *impl->autograd;
  if (m.grad_fn) return {m.grad_fn, m.output_nr};
  if (!m.requires_grad) return {};
  auto acc = m.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    m.grad_accumulator = acc;
  }
  return {acc, 0};
}

DType gradient_dtype(const Tensor& t) {
  const TensorImpl* impl = t.unsafe_impl();
  if (!is_reduced_floating(t.dtype()) || !impl->autograd) return t.dtype();
  const Node* fn = impl->autograd->grad_fn.get();
  if (fn && fn->cast_output && fn->input_meta.size() == 1 && fn->input_meta[0].dtype == kFloat32)
    return kFloat32;
  return t.dtype();
}

std::shared_ptr<Node> record(const char* name, const TensorList& inputs, const TensorList& outputs,
                             BackwardFn fn) {
  if (!any_requires_grad(inputs)) return nullptr;
  auto node = std::make_shared<FunctionNode>(backward_name(name), std::move(fn));
  node->next_edges.reserve(inputs.size());
  node->input_meta.reserve(inputs.size());
  for (const Tensor& in : inputs) {
    if (in.defined() && in.requires_grad()) {
      node->next_edges.push_back(gradient_edge(in));
      node->input_meta.push_back({in.sizes(), in.dtype(), in.device(), std::nullopt});
      if (const DType wide = gradient_dtype(in); wide != in.dtype()) node->input_meta.back().wide_dtype = wide;
    } else {
      node->next_edges.push_back({});
      node->input_meta.push_back({});
    }
  }
  node->num_outputs = uint32_t(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    AutogradMeta& m = outputs[i].unsafe_impl()->meta();
    m.grad_fn = node;
    m.output_nr = uint32_t(i);
  }
  return node;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.sizes() == shape) return g;
  const int64_t lead = g.dim() - int64_t(shape.size());
  AG_CHECK(lead >= 0, "sum_to", "cannot sum shape ", g.sizes(), " to shape ", shape);
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < lead; ++i) dims.push_back(i);
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t gs = g.sizes()[size_t(lead) + i];
    if (shape[i] == 1 && gs != 1) dims.push_back(lead + int64_t(i));
    else AG_CHECK(shape[i] == gs, "sum_to", "cannot sum shape ", g.sizes(), " to shape ", shape);
  }
  Tensor r = dims.empty() ? g : sum(g, dims, true);
  return lead > 0 || r.sizes() != shape ? r.view(shape.vec()) : r;
}

namespace {

Tensor fit_gradient(const Node& node, size_t i, Tensor g) {
  const InputMeta& meta = node.input_meta[i];
  if (g.sizes() != meta.sizes) {
    try {
      g = sum_to(g, meta.sizes);
    } catch (const Error&) {
      std::ostringstream os;
      os << "[" << node.name() << "] returned a gradient of shape " << g.sizes()
         << " for input " << i << " of shape " << meta.sizes;
      throw Error(os.str());
    }
  }
  if (g.dtype() != meta.dtype && g.dtype() != meta.wide_dtype) g = g.to(meta.dtype);
  // A 0-dim CPU tensor used as a scalar by another device's op gets its gradient there.
  if (g.device() != meta.device) g = g.to(meta.device);
  return g;
}

// Sums a gradient into its slot. A slot tensor that nothing else holds (no other slot,
// no saved tensor, no view of its storage) and whose memory is dense and non-overlapping
// takes the sum in place: no new buffer, and the write goes to memory that is already in
// cache. The first gradient to arrive is often a view that fails the second test (the
// backward of sum, mean and broadcasting hands out an expanded view); it gets a new sum.
void accumulate(TensorList& buffer, size_t slot, Tensor g) {
  Tensor& b = buffer[slot];
  if (!b.defined()) {
    b = std::move(g);
    return;
  }
  const TensorImpl& bi = *b.unsafe_impl();
  if (b.impl_ptr().use_count() == 1 && bi.storage && bi.storage.use_count() == 1 && can_add_in_place(b, g)) {
    b.add_(g);
    return;
  }
  b = add(b, g);
}

struct ByNewest {
  bool operator()(const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) const {
    return a->sequence_nr < b->sequence_nr;
  }
};

}  // namespace

void run_backward(const TensorList& roots, const TensorList& grad_roots, bool retain_graph) {
  NoGradGuard no_grad;
  // Backward runs in the dtypes the forward used: no autocast, even inside a region.
  dispatch::ExcludeAutocastGuard no_autocast;
  std::unordered_map<Node*, TensorList> buffers;
  std::vector<std::shared_ptr<Node>> starts;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    AG_CHECK(root.defined(), "backward", "called on an undefined tensor");
    AG_CHECK(root.requires_grad(), "backward", "tensor ", i, " (shape ", root.sizes(),
             ") does not require grad and has no grad_fn");
    Tensor g = i < grad_roots.size() ? grad_roots[i] : Tensor();
    if (!g.defined()) {
      AG_CHECK(root.numel() == 1, "backward",
               "a gradient can be created implicitly only for single-element tensors, got shape ",
               root.sizes(), "; pass a gradient");
      g = ones_like(root);
    }
    AG_CHECK(g.sizes() == root.sizes(), "backward", "gradient of shape ", g.sizes(),
             " does not match the tensor's shape ", root.sizes());
    Edge e = gradient_edge(root);
    TensorList& buf = buffers[e.fn.get()];
    buf.resize(e.fn->num_outputs);
    accumulate(buf, e.input_nr, g.to(root.dtype()));
    starts.push_back(e.fn);
  }

  // Count, for every reachable node, how many edges lead into it.
  std::unordered_map<Node*, int> deps;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (auto& s : starts)
    if (seen.insert(s.get()).second) stack.push_back(s.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.valid()) continue;
      ++deps[e.fn.get()];
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }

  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, ByNewest> ready;
  std::unordered_set<Node*> queued;
  for (auto& s : starts)
    if (deps[s.get()] == 0 && queued.insert(s.get()).second) ready.push(s);

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    TensorList grads = std::move(buffers[node.get()]);
    buffers.erase(node.get());
    grads.resize(node->num_outputs);
    for (auto& [nr, hook] : node->pre_hooks) {
      if (nr < grads.size() && grads[nr].defined()) {
        if (node->cast_output && grads[nr].dtype() != *node->cast_output)
          grads[nr] = grads[nr].to(*node->cast_output);  // hooks see the cast's own dtype
        Tensor r = hook(grads[nr]);
        if (r.defined()) grads[nr] = std::move(r);
      }
    }
    TensorList outs = node->apply(std::move(grads));
    if (!retain_graph) node->release();
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.valid()) continue;
      if (i < outs.size() && outs[i].defined()) {
        TensorList& buf = buffers[e.fn.get()];
        buf.resize(e.fn->num_outputs);
        accumulate(buf, e.input_nr, fit_gradient(*node, i, std::move(outs[i])));
      }
      if (--deps[e.fn.get()] == 0) ready.push(e.fn);
    }
  }
}

// ---- Tensor's autograd methods ------------------------------------------------------------

bool Tensor::requires_grad() const {
  const auto& m = impl().autograd;
  return m && (m->requires_grad || m->grad_fn);
}

Tensor& Tensor::requires_grad_(bool r) {
  if (r) {
    AG_CHECK(is_floating(dtype()), "requires_grad_", "only floating tensors can require gradients, got ",
             dtype_name(dtype()));
  } else {
    AG_CHECK(is_leaf(), "requires_grad_",
             "cannot turn off requires_grad on a non-leaf tensor; use detach()");
  }
  impl().meta().requires_grad = r;
  return *this;
}

Tensor Tensor::grad() const {
  const auto& m = impl().autograd;
  return m ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined())
    AG_CHECK(g.sizes() == sizes(), "set_grad", "gradient of shape ", g.sizes(),
             " does not match the tensor's shape ", sizes());
  impl().meta().grad = g;
}

bool Tensor::is_leaf() const {
  const auto& m = impl().autograd;
  return !m || !m->grad_fn;
}

const std::shared_ptr<Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<Node> none;
  const auto& m = impl().autograd;
  return m ? m->grad_fn : none;
}

uint32_t Tensor::output_nr() const {
  const auto& m = impl().autograd;
  return m ? m->output_nr : 0;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  run_backward({*this}, {gradient}, retain_graph);
}

void Tensor::register_hook(GradHook hook) const {
  AG_CHECK(requires_grad(), "register_hook", "cannot register a hook on a tensor that does not require grad");
  AutogradMeta& m = impl().meta();
  if (m.grad_fn) m.grad_fn->pre_hooks.emplace_back(m.output_nr, std::move(hook));
  else m.hooks.push_back(std::move(hook));
}

void Tensor::register_post_accumulate_grad_hook(PostAccumulateHook hook) const {
  AG_CHECK(requires_grad() && is_leaf(), "register_post_accumulate_grad_hook",
           "expected a leaf tensor that requires grad, got ", requires_grad() ? "a non-leaf" : "a tensor that does not require grad");
  impl().meta().post_accumulate_hooks.push_back(std::move(hook));
}

Tensor Tensor::detach() const {
  const TensorImpl& i = impl();
  return Tensor(std::make_shared<TensorImpl>(i.storage, i.sizes, i.strides, i.offset, i.dtype));
}

Tensor& Tensor::detach_() {
  if (impl().autograd) {
    impl().autograd->grad_fn.reset();
    impl().autograd->requires_grad = false;
  }
  return *this;
}

std::vector<std::pair<Device, TensorList>> gradients_by_device(const std::vector<Tensor>& params) {
  std::vector<std::pair<Device, TensorList>> out;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (!g.is_contiguous()) {
      g = g.contiguous();
      p.set_grad(g);
    }
    size_t k = 0;
    while (k < out.size() && !(out[k].first == g.device())) ++k;
    if (k == out.size()) out.emplace_back(g.device(), TensorList{});
    out[k].second.push_back(g);
  }
  return out;
}

}  // namespace ampgrad
