// Lite and its wrappers (lite.h): the decision at construction, the per-iteration loss-scale
// bookkeeping, the plain-backward guard under 16-mixed, and checkpoints.
#include "ampgrad/wrappers/lite.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "ampgrad/autograd.h"
#include "ampgrad/backend.h"
#include "ampgrad/error.h"
#include "ampgrad/factories.h"
#include "ampgrad/matmul_precision.h"
#include "ampgrad/ops/elementwise.h"
#include "ampgrad/ops/reduce.h"
#include "ampgrad/ops/shape.h"
#include "ampgrad/state_number.h"

namespace ampgrad {

const char* output_conversion_name(OutputConversion c) {
  switch (c) {
    case OutputConversion::ToDefault: return "to-default";
    case OutputConversion::ToInputDType: return "to-input-dtype";
    case OutputConversion::None: return "none";
  }
  return "?";
}

OutputConversion parse_output_conversion(std::string_view s) {
  for (OutputConversion c : {OutputConversion::ToDefault, OutputConversion::ToInputDType, OutputConversion::None})
    if (s == output_conversion_name(c)) return c;
  AG_ERROR("output_conversion", "unknown output conversion \"", s,
           "\"; allowed: \"to-default\", \"to-input-dtype\", \"none\"");
}

namespace {

// Depth of Lite::backward calls on this thread: a guarded output's hook refuses a
// backward that does not come from one.
thread_local int t_lite_backward_depth = 0;

struct LiteBackwardScope {
  LiteBackwardScope() { ++t_lite_backward_depth; }
  ~LiteBackwardScope() { --t_lite_backward_depth; }
};

std::string describe(const hw::HardwareProfile& p, const PrecisionDecision& d) {
  std::ostringstream os;
  const auto& c = p.cpu;
  os << "cpu      : " << c.model_name << ", " << c.logical_cores << " logical cores; avx2 " << (c.avx2 ? "yes" : "no")
     << ", avx512f " << (c.avx512f ? "yes" : "no") << ", avx512_bf16 " << (c.avx512_bf16 ? "yes" : "no")
     << ", avx512_fp16 " << (c.avx512_fp16 ? "yes" : "no") << ", amx_bf16 " << (c.amx_bf16 ? "yes" : "no")
     << "; oneDNN " << p.onednn_isa << "\n";
  if (!p.built_with_cuda) os << "cuda     : not built\n";
  else if (p.cuda.empty()) os << "cuda     : built, no device\n";
  for (const auto& g : p.cuda)
    os << "cuda:" << g.index << "   : " << g.name << ", compute capability " << g.compute_capability() << ", "
       << g.sm_count << " SMs, " << (g.total_memory >> 20) << " MiB\n";
  os << "device   : ";
  for (size_t i = 0; i < d.devices.size(); ++i) os << (i ? ", " : "") << d.devices[i].str();
  os << " (" << d.accelerator_reason << ")\n";
  os << "precision: " << precision_name(d.precision) << " (" << d.reason << ")";
  for (const Device& dev : d.devices) {
    const hw::Verdict v = hw::verdict(p, dev, compute_dtype(d.precision));
    os << "\n           " << dev.str() << " " << dtype_name(compute_dtype(d.precision)) << ": "
       << hw::support_name(v.support) << ", " << v.reason;
  }
  return os.str();
}

}  // namespace

// ---- LiteCore ------------------------------------------------------------------------------

namespace detail {

Tensor LiteCore::to_device(const Tensor& t) const {
  if (!t.defined() || t.device() == device) return t;
  return t.to(device);
}

void LiteCore::guard_output(const Tensor& t) const {
  if (!plugin->scales_loss() || !t.defined() || !t.requires_grad()) return;
  t.register_hook([](const Tensor&) -> Tensor {
    AG_CHECK(t_lite_backward_depth > 0, "backward",
             "this loss comes from a module wrapped by ag::Lite with precision 16-mixed: call "
             "lite.backward(loss) instead of loss.backward(), so that the loss is scaled (without "
             "the scale the float16 gradients underflow and the scaler's unscale is wrong)");
    return Tensor();
  });
}

DType LiteCore::output_dtype(const std::vector<DType>& input_dtypes) const {
  std::vector<DType> distinct;
  for (DType d : input_dtypes)
    if (std::find(distinct.begin(), distinct.end(), d) == distinct.end()) distinct.push_back(d);
  if (distinct.empty()) return get_default_dtype();
  if (distinct.size() > 1) {
    std::string names;
    for (size_t i = 0; i < distinct.size(); ++i) names += (i ? ", " : "") + std::string(dtype_name(distinct[i]));
    AG_ERROR("LiteModule", "output conversion to-input-dtype needs one floating dtype among the inputs, got ", names,
             "; convert the inputs to one dtype, or use to-default or none");
  }
  return distinct.front();
}

void LiteCore::finish_iteration() {
  GradScaler* s = plugin->scaler();
  if (!stepped.empty() || !unscaled.empty()) {
    if (s && s->is_enabled()) s->update();
    stepped.clear();
    unscaled.clear();
  }
}

void LiteCore::unscale(optim::Optimizer& opt) {
  if (unscaled.count(&opt) || stepped.count(&opt)) return;
  plugin->unscale_gradients(opt);
  unscaled.insert(&opt);
}

StepResult LiteCore::step(optim::Optimizer& opt) {
  const StepResult ok = plugin->optimizer_step(opt);
  stepped.insert(&opt);
  bool all = true;
  for (const optim::Optimizer* o : optimizers) all = all && stepped.count(o);
  if (all) finish_iteration();
  return ok;
}

void LiteCore::broadcast_module(nn::Module& module) {
  if (group == nullptr) return;
  NoGradGuard ng;
  for (const Tensor& p : module.parameters()) group->broadcast(p, 0);
  for (auto& [name, b] : module.named_buffers()) group->broadcast(b, 0);
}

void LiteCore::average_gradients_of(nn::Module& module) {
  if (reducer) reducer->add_parameters(module.parameters());
}

void LiteCore::name_parameters(nn::Module& module) {
  for (const auto& [name, p] : module.named_parameters()) parameter_names.emplace(p.unsafe_impl(), name);
}

void LiteCore::warn(const std::string& line) const {
  if (options.warn) options.warn(line);
  else std::fprintf(stderr, "warning: %s\n", line.c_str());
}

}  // namespace detail

// ---- Lite ----------------------------------------------------------------------------------

NoBackwardSync::NoBackwardSync(std::shared_ptr<detail::LiteCore> core) : core_(std::move(core)) {
  ++core_->no_sync_depth;
}
NoBackwardSync::~NoBackwardSync() { --core_->no_sync_depth; }

Lite::Lite(LiteOptions options) : core_(std::make_shared<detail::LiteCore>()) {
  core_->options = std::move(options);
  const LiteOptions& o = core_->options;
  const hw::HardwareProfile& profile = o.profile ? *o.profile : hw::query();
  const std::string requested = o.precision.empty() ? default_precision_string() : o.precision;
  core_->decision = resolve_precision(requested, o.accelerator, profile);
  core_->record =
      o.recorded && o.recorded->precision == core_->decision.precision &&
              o.recorded->float32_matmul == get_float32_matmul_precision()
          ? *o.recorded
          // "auto:measure" is the table's choice until measure_precision runs
          : make_precision_record(core_->decision, parse_precision(requested).measure ? "auto" : requested, profile);
  core_->device = core_->decision.devices.front();
  core_->plugin = make_precision_plugin(core_->decision.precision, core_->device.type, {.scaler = o.scaler});
  core_->description = ampgrad::describe(profile, core_->decision);
  AG_CHECK(o.strategy == "single" || o.strategy == "ddp", "Lite", "unknown strategy \"", o.strategy,
           "\" (single, ddp)");
  if (o.strategy == "ddp") {
    AG_CHECK(core_->device.type == kCPU || dist::built_with_nccl(), "Lite", "strategy ddp on ", core_->device,
             " needs NCCL, which this build has not (CPU tensors go through MPI)");
    dist::ProcessGroup* group = core_->group = &dist::ProcessGroup::world();
    if (core_->device.type == kCUDA) {  // one GPU per process: the rank on this machine picks it
      const int count = backend(Device(kCUDA), "Lite").device_count();
      AG_CHECK(group->local_rank() < count, "Lite", "strategy ddp runs one process per GPU: local rank ",
               group->local_rank(), " of ", group->local_size(), " on a machine with ", count, " GPUs");
      core_->device = Device(kCUDA, group->local_rank());
    }
    core_->reducer = std::make_unique<dist::GradReducer>(*group, o.ddp);
    // 16-mixed: a step skipped on one rank is skipped on all (the flag's max over the
    // ranks), so that parameters and scales stay equal everywhere.
    if (GradScaler* s = core_->plugin->scaler())
      s->set_found_inf_reduction([group](const Tensor& flag) { group->all_reduce(flag, dist::ReduceOp::Max); });
  }
  if (!core_->decision.warning.empty() && is_global_zero()) core_->warn(core_->decision.warning);
}

TrialReport Lite::measure_precision(nn::Module& model, const TrialOptimizerFactory& make_optimizer,
                                    const TrialLoss& loss, const std::vector<data::Batch>& batches,
                                    const TrialOptions& options) {
  constexpr const char* kOp = "Lite::measure_precision";
  const LiteOptions& o = core_->options;
  const std::string requested = o.precision.empty() ? default_precision_string() : o.precision;
  AG_CHECK(parse_precision(requested).measure, kOp, "this Lite runs precision \"", requested,
           "\"; a trial decides only under \"auto:measure\"");
  AG_CHECK(core_->optimizers.empty(), kOp, "call it before setting up an optimizer: the trial decides the precision ",
           "the setup converts to");
  const hw::HardwareProfile& profile = o.profile ? *o.profile : hw::query();
  if (core_->device != Device(kCPU)) model.to(core_->device);
  std::vector<data::Batch> on_device;
  for (const data::Batch& b : batches) on_device.push_back({core_->to_device(b.input), core_->to_device(b.target)});
  TrialReport report;
  const bool several = core_->group != nullptr && core_->group->size() > 1;
  if (!several || core_->group->rank() == 0)
    report = measure_precisions(model, make_optimizer, loss, on_device, options, profile);
  if (several) {
    // Rank 0 measures and every rank runs its choice: no rank decides differently.
    Tensor choice = scalar_tensor(int64_t(0)).to(core_->device);
    if (core_->group->rank() == 0)
      choice = scalar_tensor(int64_t(int(report.chosen().precision) * 2 + int(report.chosen().medium_matmul)))
                   .to(core_->device);
    core_->group->broadcast(choice, 0);
    const int64_t v = choice.to(Device(kCPU)).item<int64_t>();
    if (core_->group->rank() != 0) {
      TrialRow row;
      row.candidate = {Precision(v / 2), v % 2 == 1};
      row.note = "measured on rank 0";
      report.rows = {row};
      report.decision.chosen = 0;
      report.decision.reason = row.candidate.name() + ": rank 0's trial chose it";
      report.decision.rejected = {""};
    }
  }
  const TrialCandidate& c = report.chosen();
  if (c.medium_matmul) set_float32_matmul_precision("medium");
  core_->decision.precision = c.precision;
  core_->decision.reason = "measured: " + report.decision.reason;
  core_->decision.warning.clear();
  core_->plugin = make_precision_plugin(c.precision, core_->device.type, {.scaler = o.scaler});
  core_->record = make_precision_record(core_->decision, requested, profile, report.table());
  core_->description = ampgrad::describe(profile, core_->decision);
  return report;
}

LiteDataLoader Lite::setup_dataloader(data::DataLoader loader) {
  if (core_->group == nullptr || core_->group->size() == 1) return LiteDataLoader(std::move(loader), core_);
  data::DataLoaderOptions o = loader.options();
  AG_CHECK(o.num_shards == 1, "Lite::setup_dataloader", "the loader is sharded already (", o.num_shards,
           " shards); under ddp Lite shards it over the ranks");
  o.num_shards = world_size();
  o.shard = rank();
  if (o.shuffle && !o.shuffle_seed) {
    const auto [seed, offset] = generator_state();
    Tensor shared = scalar_tensor(int64_t((seed * 0x9E3779B97F4A7C15ull) ^ offset));
    core_->group->broadcast(shared, 0);
    o.shuffle_seed = uint64_t(shared.item<int64_t>());
  }
  return LiteDataLoader(data::DataLoader(loader.dataset_ptr(), o), core_);
}

void Lite::barrier() const {
  if (core_->group) core_->group->barrier();
}
void Lite::all_reduce(const Tensor& t, dist::ReduceOp op) const {
  if (core_->group) core_->group->all_reduce(t, op);
}
void Lite::broadcast(const Tensor& t, int src) const {
  AG_CHECK(src >= 0 && src < world_size(), "broadcast", "the source rank must be in [0, ", world_size(), "), got ", src);
  if (core_->group) core_->group->broadcast(t, src);
}
Tensor Lite::all_gather(const Tensor& t) const {
  if (core_->group) return core_->group->all_gather(t);
  return t.dim() == 0 ? reshape(t, {1}).clone() : t.clone();
}

void Lite::convert(nn::Module& module) {
  if (core_->device != Device(kCPU)) module.to(core_->device);
  core_->plugin->convert_module(module);
}

LiteOptimizer Lite::setup_optimizer(optim::Optimizer& optimizer) {
  const Precision p = precision();
  if (p == Precision::True16 || p == Precision::TrueBF16) {
    optimizer.set_update_rounding(core_->options.update_rounding);
    if (core_->options.update_rounding == UpdateRounding::Master) optimizer.init_master_weights();
    optimizer.set_count_stalled(core_->options.count_stalled);
  }
  auto& list = core_->optimizers;
  if (std::find(list.begin(), list.end(), &optimizer) == list.end()) list.push_back(&optimizer);
  return LiteOptimizer(optimizer, core_);
}

void Lite::backward(const Tensor& loss) {
  core_->finish_iteration();  // a new iteration: apply the pending scale update first
  LiteBackwardScope scope;
  const bool reduce = core_->reducer && core_->no_sync_depth == 0;
  if (reduce) core_->reducer->prepare();
  core_->plugin->backward(loss);
  if (reduce) core_->reducer->finish();
  core_->last_loss = loss.detach();
}

Tensor Lite::clip_gradients(nn::Module& module, LiteOptimizer& optimizer, double max_norm) {
  core_->unscale(optimizer.optimizer());
  return nn::clip_grad_norm_(module.parameters(), max_norm);
}

void Lite::seed_everything(uint64_t seed) const { manual_seed(seed); }

int64_t Lite::skipped_steps() const {
  GradScaler* s = core_->plugin->scaler();
  return s ? s->skipped_steps() : 0;
}

void Lite::save(const std::string& path, const LiteState& state) {
  core_->finish_iteration();
  nn::StateDict tensors;
  nn::Metadata meta;
  for (const auto& [name, item] : state) {
    AG_CHECK(name.rfind("lite.", 0) != 0, "Lite::save", "the name \"", name, "\" is reserved (lite.*)");
    item.save(name, tensors, meta);
  }
  for (auto& [k, v] : core_->plugin->state_dict()) tensors["lite.precision_state." + k] = v;
  const auto [seed, offset] = generator_state();
  for (auto& [k, v] : core_->record.to_metadata()) meta[k] = v;  // "lite.precision" and "lite.precision.*"
  meta["lite.rng_seed"] = std::to_string(seed);
  meta["lite.rng_offset"] = std::to_string(offset);
  if (is_global_zero()) nn::save(path, tensors, meta);
  barrier();  // the file is complete before any rank goes on (and may load it)
}

namespace {

// An error from a nested load (a module's, the optimizer's, the scaler's), restated with
// the file and the item: "[Lite::load] <path>: <what>: <message without its [op]>".
template <class F>
void naming_the_file(const std::string& path, const std::string& what, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.rfind("[Lite::load] ", 0) == 0 && msg.find(path) != std::string::npos) throw;  // names it already
    AG_ERROR("Lite::load", path, ": ", what, ": ", e.message());
  }
}

}  // namespace

void Lite::load(const std::string& path, const LiteState& state, bool strict) {
  nn::Metadata meta;
  const nn::StateDict tensors = nn::load(path, &meta);
  const std::string prefix = "lite.precision_state.";
  // Everything that can be checked before anything is restored is checked first: the
  // precision's state, the items' presence, unknown keys, the generator's position.
  if (auto it = meta.find("lite.precision"); it != meta.end()) {
    // Only the names save() writes: a precision that ran, not "auto" or an old spelling.
    AG_CHECK(precision_from_name(it->second).has_value(), "Lite::load", path, ": metadata \"lite.precision\" is \"", it->second,
             "\", which is not a precision (a checkpoint records the one it was saved under: 32-true, 64-true, "
             "16-mixed, bf16-mixed, 16-true or bf16-true)");
  }
  std::optional<PrecisionRecord> recorded;
  naming_the_file(path, "metadata", [&] { recorded = precision_record_from_metadata(meta); });
  std::map<std::string, Tensor> plugin_state;
  for (const auto& [k, v] : tensors)
    if (k.rfind(prefix, 0) == 0) plugin_state[k.substr(prefix.size())] = v;
  if (!plugin_state.empty())
    AG_CHECK(core_->plugin->scaler(), "Lite::load", path, " holds grad-scaler state (saved under ",
             meta.count("lite.precision") ? meta.at("lite.precision") : std::string("16-mixed"),
             "), but this Lite runs ", precision_name(precision()));
  const auto owned = [&](const std::string& k, bool in_metadata) {
    return std::any_of(state.begin(), state.end(), [&](const auto& it) { return it.second.owns(it.first, k, in_metadata); });
  };
  for (const auto& [name, item] : state) {
    bool present = false;
    for (const auto& [k, v] : tensors) present = present || item.owns(name, k, false);
    for (const auto& [k, v] : meta) present = present || item.owns(name, k, true);
    if (!present) item.load(name, tensors, meta, path);  // throws "... has no <item>" before changing anything
  }
  if (strict) {  // every key belongs to an item or to Lite itself
    std::vector<std::string> unknown;
    for (const auto& [k, v] : tensors)
      if (k.rfind(prefix, 0) != 0 && !owned(k, false)) unknown.push_back(k);
    for (const auto& [k, v] : meta)
      if (k != "lite.precision" && k.rfind("lite.precision.", 0) != 0 && k != "lite.rng_seed" &&
          k != "lite.rng_offset" && !owned(k, true))
        unknown.push_back(k + " (metadata)");
    if (!unknown.empty()) {
      std::string list;
      for (size_t i = 0; i < unknown.size() && i < 8; ++i) list += (i ? ", " : "") + ("\"" + unknown[i] + "\"");
      if (unknown.size() > 8) list += ", ... (" + std::to_string(unknown.size()) + " in all)";
      AG_ERROR("Lite::load", path, ": unexpected keys that belong to no item of the state: ", list,
               "; pass strict = false to ignore them");
    }
  }
  uint64_t seed = 0, offset = 0;
  const bool has_rng = meta.count("lite.rng_seed") || meta.count("lite.rng_offset");
  if (has_rng) {
    AG_CHECK(meta.count("lite.rng_seed") && meta.count("lite.rng_offset"), "Lite::load", path,
             ": has only one of lite.rng_seed and lite.rng_offset");
    naming_the_file(path, "metadata", [&] {
      seed = detail::parse_u64(meta.at("lite.rng_seed"), "Lite::load", "lite.rng_seed");
      offset = detail::parse_u64(meta.at("lite.rng_offset"), "Lite::load", "lite.rng_offset");
    });
  }
  for (const auto& entry : state) {  // named members, not a structured binding: lambdas capture them
    const std::string& name = entry.first;
    const StateItem& item = entry.second;
    naming_the_file(path, "\"" + name + "\"", [&] { item.load(name, tensors, meta, path); });
  }
  if (!plugin_state.empty())
    naming_the_file(path, "grad-scaler state (" + prefix + "*)", [&] { core_->plugin->load_state_dict(plugin_state); });
  core_->stepped.clear();
  core_->unscaled.clear();
  if (has_rng) set_generator_state(seed, offset);
  // Loaded: the values were converted to this Lite's dtypes, which is allowed, but the run
  // no longer trains as the one that saved it did.
  if (recorded && recorded->precision != precision() && is_global_zero())
    core_->warn(path + " was saved under " + precision_name(recorded->precision) + " (" + recorded->how + " on " +
                recorded->decided_on() + "); this Lite runs " + precision_name(precision()) + " (" + core_->record.how +
                "); pass precision \"" + precision_name(recorded->precision) + "\" to keep the recorded one");
}

// ---- LiteOptimizer and LiteScheduler -------------------------------------------------------

LiteOptimizer::LiteOptimizer(optim::Optimizer& opt, std::shared_ptr<detail::LiteCore> core)
    : opt_(&opt),
      // On Lite's device, where setup_module puts the parameters (it may run after this):
      // counting on another device would copy every step's flag there, a host sync.
      taken_at_setup_(opt.step_count().to(core->device).clone()),
      skipped_(zeros({}, TensorOptions(kInt64).device(core->device))),
      skip_run_(zeros({}, TensorOptions(kInt64).device(core->device))),
      core_(std::move(core)) {}

StepResult LiteOptimizer::step() {
  AG_CHECK(opt_ != nullptr, "LiteOptimizer::step", "not set up (use lite.setup)");
  NoGradGuard ng;
  GradScaler* scaler = core_->plugin->scaler();
  const bool scaled = scaler != nullptr && scaler->is_enabled();
  const Tensor before = scaled ? scaler->scale_tensor().clone() : Tensor();
  StepResult r = core_->step(*opt_);
  if (scaled) r.with_scales(before, scaler->scale_tensor().clone());
  last_ = r;
  if (r.on_device()) {
    // Decided on the device: count there, and extend or end the run of skips, with no sync.
    const Tensor skipped = amax(ne(r.found_inf(), 0.0).to(kInt64)).to(skipped_.device());
    skipped_.add_(skipped);
    skip_run_.add_(1).mul_(skipped);
  } else if (!r) {
    skipped_.add_(1);
    skip_run_.add_(1);
  } else {
    skip_run_.zero_();
  }
  if (core_->options.report_overflows && scaled && !r) core_->warn(explain_overflow().describe());
  return r;
}

OverflowReport LiteOptimizer::explain_overflow(size_t limit) const {
  OverflowReport rep;
  if (opt_ == nullptr || !last_.on_device() || bool(last_)) return rep;
  NoGradGuard ng;
  rep.skipped = true;
  rep.scale_before = last_.scale_before();
  rep.scale_after = last_.scale_after();
  if (core_->last_loss.defined()) {
    rep.loss = core_->last_loss.to(kFloat64).item<double>();
    rep.loss_finite = std::isfinite(rep.loss);
  }
  const std::vector<Tensor> params = opt_->parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    const Tensor g = params[k].grad();
    if (!g.defined()) continue;
    int64_t nan = 0, inf = 0;
    for (const double v : g.to_vector<double>()) {
      nan += std::isnan(v);
      inf += std::isinf(v);
    }
    if (nan + inf == 0) continue;
    ++rep.nonfinite_parameters;
    if (rep.parameters.size() >= limit) continue;
    const auto it = core_->parameter_names.find(params[k].unsafe_impl());
    rep.parameters.push_back({it != core_->parameter_names.end() ? it->second : "parameter " + std::to_string(k),
                              params[k].sizes(), nan, inf});
  }
  return rep;
}

std::string OverflowReport::describe() const {
  if (!skipped) return "the last step was not skipped";
  std::ostringstream os;
  os << "step skipped: the loss was " << (loss_finite ? "finite (" : "not finite (") << loss << ")";
  if (nonfinite_parameters == 0) {
    os << "; no gradient held inf or NaN when asked (zero_grad before explain_overflow?)";
  } else {
    os << "; " << nonfinite_parameters
       << (nonfinite_parameters == 1 ? " parameter's gradient" : " parameters' gradients") << " held inf/NaN: ";
    for (size_t i = 0; i < parameters.size(); ++i) {
      const Parameter& p = parameters[i];
      os << (i ? ", " : "") << p.name << " [";
      for (size_t d = 0; d < p.shape.size(); ++d) os << (d ? ", " : "") << p.shape[d];
      os << "] (";
      if (p.inf) os << p.inf << " inf" << (p.nan ? ", " : "");
      if (p.nan) os << p.nan << " NaN";
      os << ")";
    }
    if (int64_t(parameters.size()) < nonfinite_parameters)
      os << ", and " << nonfinite_parameters - int64_t(parameters.size()) << " more";
  }
  os << "; loss scale " << scale_before << " -> " << scale_after;
  return os.str();
}

int64_t LiteOptimizer::steps_taken() const { return (optimizer().step_count() - taken_at_setup_).item<int64_t>(); }
int64_t LiteOptimizer::steps_skipped() const { return skipped_.item<int64_t>(); }
int64_t LiteOptimizer::consecutive_skips() const { return skip_run_.item<int64_t>(); }

LiteScheduler::LiteScheduler(LiteOptimizer& opt, optim::SchedulePtr schedule)
    : opt_(&opt.optimizer()), schedule_(std::move(schedule)) {
  AG_CHECK(schedule_ != nullptr, "LiteScheduler", "the schedule is null");
  for (size_t g = 0; g < opt_->num_groups(); ++g) base_.push_back(opt_->lr(g));
  set_last_step(0);
}

// The table holds the rate of every position up to bound_ (and some beyond, so that it
// grows rarely): the position can never pass the optimizer's step() calls since bound_ was
// set, which the host counts.
void LiteScheduler::ensure_table(int64_t last_position) {
  if (last_position < table_len_) return;
  const int64_t len = std::max<int64_t>(2 * table_len_, last_position + 64);
  const Device dev = opt_->step_count().device();
  table_.clear();
  for (double base : base_) {
    std::vector<double> v(static_cast<size_t>(len));
    for (int64_t t = 0; t < len; ++t) v[size_t(t)] = schedule_->lr(t, base);
    table_.push_back(from_vector<double>(v, {len}).to(dev));  // a copy to the device: no host sync
  }
  table_len_ = len;
}

void LiteScheduler::apply() {
  const Tensor index = position_.reshape({1});
  for (size_t g = 0; g < base_.size(); ++g) opt_->set_lr(g, table_[g].index_select(0, index));
}

void LiteScheduler::step() {
  NoGradGuard ng;
  const Tensor count = opt_->step_count();
  position_ = position_ + (count - seen_);
  seen_ = count.clone();
  ensure_table(bound_ + (opt_->step_calls() - calls_at_bound_));
  apply();
}

int64_t LiteScheduler::last_step() const { return position_.item<int64_t>(); }

void LiteScheduler::set_last_step(int64_t t) {
  AG_CHECK(t >= 0, "LiteScheduler::set_last_step", "expected a non-negative step, got ", t);
  NoGradGuard ng;
  const Device dev = opt_->step_count().device();
  position_ = full({}, t, TensorOptions(kInt64).device(dev));
  seen_ = opt_->step_count().clone();
  bound_ = t;
  calls_at_bound_ = opt_->step_calls();
  ensure_table(t);
  apply();
}

// ---- StateItem -----------------------------------------------------------------------------

namespace {

void need(bool ok, const std::string& path, const std::string& what) {
  AG_CHECK(ok, "Lite::load", path, " has no ", what, " (was it saved under another name?)");
}

nn::StateDict with_prefix(const nn::StateDict& all, const std::string& prefix) {
  nn::StateDict out;
  for (const auto& [k, v] : all)
    if (k.rfind(prefix, 0) == 0) out[k.substr(prefix.size())] = v;
  return out;
}

}  // namespace

StateItem::StateItem(nn::Module& module) {
  nn::Module* m = &module;
  save_ = [m](const std::string& name, nn::StateDict& t, nn::Metadata&) {
    for (auto& [k, v] : m->state_dict()) t[name + "." + k] = v;
  };
  load_ = [m](const std::string& name, const nn::StateDict& t, const nn::Metadata&, const std::string& path) {
    const nn::StateDict mine = with_prefix(t, name + ".");
    need(!mine.empty(), path, "module \"" + name + "\"");
    m->load_state_dict(mine);
  };
}

StateItem::StateItem(optim::Optimizer& optimizer) {
  optim::Optimizer* o = &optimizer;
  save_ = [o](const std::string& name, nn::StateDict& t, nn::Metadata&) {
    for (auto& [k, v] : o->state_dict()) t[name + "." + k] = v.clone();
  };
  load_ = [o](const std::string& name, const nn::StateDict& t, const nn::Metadata&, const std::string& path) {
    const nn::StateDict mine = with_prefix(t, name + ".");
    need(!mine.empty(), path, "optimizer \"" + name + "\"");
    o->load_state_dict(mine);
  };
}

StateItem::StateItem(LiteOptimizer& optimizer) : StateItem(optimizer.optimizer()) {}

StateItem::StateItem(LiteScheduler& scheduler) {
  LiteScheduler* s = &scheduler;
  keys_ = Keys::Prefix;
  save_ = [s](const std::string& name, nn::StateDict& t, nn::Metadata&) { t[name + ".last_step"] = s->position().clone(); };
  load_ = [s](const std::string& name, const nn::StateDict& t, const nn::Metadata&, const std::string& path) {
    const auto it = t.find(name + ".last_step");
    need(it != t.end(), path, "scheduler \"" + name + "\"");
    for (const auto& [k, v] : with_prefix(t, name + "."))
      AG_CHECK(k == "last_step", "Lite::load", path, ": unexpected key '", name + "." + k, "' for scheduler \"", name,
               "\" (it saves only ", name, ".last_step)");
    s->set_last_step(detail::state_int(it->second, "Lite::load", name + ".last_step"));
  };
}

// A number saved as a 0-dim tensor of its own dtype (int64 or float64).
template <class T>
void StateItem::bind_number(T& value, const char* what) {
  T* v = &value;
  keys_ = Keys::Tensor;
  save_ = [v](const std::string& name, nn::StateDict& t, nn::Metadata&) {
    t[name] = scalar_tensor(*v, TensorOptions().dtype(std::is_integral_v<T> ? kInt64 : kFloat64));
  };
  load_ = [v, what](const std::string& name, const nn::StateDict& t, const nn::Metadata&, const std::string& path) {
    const auto it = t.find(name);
    need(it != t.end(), path, std::string(what) + " \"" + name + "\"");
    // A counter must be an integer that fits (stored as a float, an integral one); a value
    // any one real number.
    if constexpr (std::is_integral_v<T>)
      *v = detail::state_int(it->second, "Lite::load", name, std::numeric_limits<int64_t>::min());
    else
      *v = detail::state_double(it->second, "Lite::load", name);
  };
}

StateItem::StateItem(int64_t& counter) { bind_number(counter, "counter"); }
StateItem::StateItem(double& value) { bind_number(value, "value"); }

StateItem::StateItem(std::string& text) {
  std::string* s = &text;
  keys_ = Keys::Text;
  save_ = [s](const std::string& name, nn::StateDict&, nn::Metadata& m) { m[name] = *s; };
  load_ = [s](const std::string& name, const nn::StateDict&, const nn::Metadata& m, const std::string& path) {
    const auto it = m.find(name);
    need(it != m.end(), path, "text \"" + name + "\"");
    *s = it->second;
  };
}

bool StateItem::owns(const std::string& name, const std::string& key, bool in_metadata) const {
  switch (keys_) {
    case Keys::Prefix: return !in_metadata && key.size() > name.size() && key.rfind(name + ".", 0) == 0;
    case Keys::Tensor: return !in_metadata && key == name;
    case Keys::Text: return in_metadata && key == name;
  }
  return false;
}

void StateItem::save(const std::string& name, nn::StateDict& tensors, nn::Metadata& meta) const {
  save_(name, tensors, meta);
}

void StateItem::load(const std::string& name, const nn::StateDict& tensors, const nn::Metadata& meta,
                     const std::string& path) const {
  load_(name, tensors, meta, path);
}

}  // namespace ampgrad
