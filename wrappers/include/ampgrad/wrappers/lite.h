// Lite: keep your own training loop; get the device and precision right with one object.
//
//   ag::Lite lite(ag::LiteOptions{.accelerator = "auto", .precision = "auto"});
//   auto [model, optimizer] = lite.setup(net, opt);   // moves to the device, converts per precision
//   for (const auto& batch : lite.setup_dataloader(loader)) {
//     optimizer.zero_grad();
//     ag::Tensor loss = ag::cross_entropy(model(batch.input), batch.target);
//     lite.backward(loss);                             // scales under 16-mixed
//     optimizer.step();                                // unscale, skip on inf/NaN, update the scale
//   }
//   lite.save("ckpt.safetensors", {{"model", model}, {"optimizer", optimizer}});
//
// The precision plugin (precision.h) does the work at each point; Lite decides which one
// from the options and the hardware (resolve_precision), and the wrappers call it:
//   - LiteModule: floating inputs converted to the parameter dtype (integers and bools
//     untouched), forward inside the plugin's context (autocast for the mixed precisions),
//     outputs converted per OutputConversion. Inputs and outputs may be tensors, vectors,
//     tuples, maps or nests of them (nested.h).
//   - LiteOptimizer::step(): the plugin's optimizer step; returns whether it stepped.
//     Under 16-mixed the scale is updated once per iteration: when every optimizer set up
//     through this Lite has stepped, or at the next backward(), whichever comes first.
//   - LiteScheduler::step() advances only when its optimizer really stepped since.
// docs/lite.md explains the choices, in particular the three output conversions.
#pragma once

#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "ampgrad/data/dataset.h"
#include "ampgrad/dist/distributed.h"
#include "ampgrad/error.h"
#include "ampgrad/nn/module.h"
#include "ampgrad/nn/serialize.h"
#include "ampgrad/optim/optimizer.h"
#include "ampgrad/optim/scheduler.h"
#include "ampgrad/wrappers/nested.h"
#include "ampgrad/wrappers/precision.h"
#include "ampgrad/wrappers/precision_record.h"
#include "ampgrad/wrappers/precision_trial.h"

namespace ampgrad {

/// What the module wrapper does to the dtype of floating outputs.
enum class OutputConversion {
  /// To the default dtype (float32 unless changed): what Lightning kept.
  ToDefault,
  /// To the one floating dtype found among all the inputs' tensors; with none, as
  /// ToDefault; with several, an ag::Error names them (never a silent choice).
  ToInputDType,
  /// Outputs as the inner module returned them.
  None,
};

/// "to-default", "to-input-dtype", "none".
const char* output_conversion_name(OutputConversion c);
/// Parses the names above; an error lists them for anything else.
OutputConversion parse_output_conversion(std::string_view s);

struct LiteOptions {
  /// "cpu", "cuda", "cuda:N", "cuda:N,M", "gpu", or "auto" (see resolve_accelerator).
  std::string accelerator = "auto";
  /// A precision string or "auto"; empty: AMPGRAD_PRECISION, else "32-true".
  std::string precision;
  /// "single": this process alone. "ddp": one process of a data-parallel job started by
  /// mpirun (docs/distributed.md): setup broadcasts rank 0's parameters and buffers,
  /// backward averages the gradients over the ranks, print and save run on rank 0 only.
  /// CPU tensors go through MPI; CUDA ones through NCCL, one GPU per process (cuda:N for
  /// the process of local rank N).
  std::string strategy = "single";
  /// "ddp": how gradients are averaged (bucket size, overlap with backward, 16-bit
  /// gradients reduced in float32 or in their own type).
  dist::ReducerOptions ddp;
  OutputConversion output_conversion = OutputConversion::ToDefault;
  /// 16-true / bf16-true: how the optimizers store the updates of the 16-bit parameters
  /// (optim::UpdateRounding, docs/precision.md "Pure 16-bit training"): Master (the
  /// default: float32 master weights, made from the float32 values before the model is
  /// converted), Nearest (what Fabric's bf16-true does: small updates are lost),
  /// Stochastic (no extra memory) or Compensated (a 16-bit Kahan buffer). Set on every
  /// group of every optimizer set up; the other precisions train float32 parameters, which
  /// ignore it.
  UpdateRounding update_rounding = UpdateRounding::Master;
  /// 16-true / bf16-true: count the stalled updates of the 16-bit parameters
  /// (optim::Optimizer::set_count_stalled) in every optimizer set up: on the device, no
  /// host sync; LiteOptimizer::stalled_count.
  bool count_stalled = true;
  /// 16-mixed: the grad scaler's options.
  GradScalerOptions scaler;
  /// 16-mixed: after every step the grad scaler skipped, make the step's OverflowReport
  /// (LiteOptimizer::explain_overflow) and pass its line to `warn`. Off by default: knowing
  /// that a step was skipped reads the device, one host sync per step.
  bool report_overflows = false;
  /// Decide from this profile instead of the machine's (tests, docs); null: hw::query().
  const hw::HardwareProfile* profile = nullptr;
  /// Where warnings go (one line each, no newline); null: standard error.
  std::function<void(const std::string&)> warn;
  /// A checkpoint's record to carry on (a resumed run that keeps the recorded precision):
  /// when `precision` resolves to the record's precision (and float32_matmul_precision()
  /// is the record's), checkpoints store this record
  /// rather than a new one, so the decision keeps its origin (how, reason, hardware).
  std::optional<PrecisionRecord> recorded;
};

/// Why the grad scaler skipped a step (16-mixed): which gradients held inf or NaN, named
/// by module path, whether the loss itself was not finite, and the loss scale around it.
struct OverflowReport {
  struct Parameter {
    /// The module path ("block0.attn.qkv.weight") within the module Lite set up that holds
    /// it, or "group G parameter J" for one no set-up module holds.
    std::string name;
    std::vector<int64_t> shape;
    int64_t nan = 0, inf = 0;  ///< elements of its gradient
  };
  /// Whether the step was skipped (all else is empty when it was not).
  bool skipped = false;
  /// The last loss given to Lite::backward (before scaling), and whether it was finite.
  double loss = std::numeric_limits<double>::quiet_NaN();
  bool loss_finite = true;
  /// The loss scale before the step and after the iteration's update.
  double scale_before = std::numeric_limits<double>::quiet_NaN();
  double scale_after = std::numeric_limits<double>::quiet_NaN();
  /// The first parameters (in the optimizer's order, at most the limit asked for) whose
  /// gradient held inf or NaN, and how many did in all.
  std::vector<Parameter> parameters;
  int64_t nonfinite_parameters = 0;
  /// One line: "step skipped: the loss was finite (2.31); 3 parameters' gradients held
  /// inf/NaN: fc2.weight [10, 32] (4 inf), ...; loss scale 65536 -> 32768".
  std::string describe() const;
};

namespace detail {

/// State shared by a Lite and the wrappers it hands out (they may outlive the Lite).
struct LiteCore {
  LiteOptions options;
  /// "ddp": the job's process group; null for "single".
  dist::ProcessGroup* group = nullptr;
  /// "ddp": averages the gradients of every module set up, during Lite::backward.
  std::unique_ptr<dist::GradReducer> reducer;
  /// Open NoBackwardSync scopes: backward leaves the gradients local.
  int no_sync_depth = 0;
  PrecisionDecision decision;
  /// What save() writes of the decision (precision_record.h).
  PrecisionRecord record;
  Device device;
  std::unique_ptr<PrecisionPlugin> plugin;
  std::string description;
  // The per-iteration bookkeeping of the loss scale (16-mixed).
  std::vector<const optim::Optimizer*> optimizers;
  /// The module path of every parameter of the modules set up, for OverflowReport.
  std::map<const void*, std::string> parameter_names;
  /// The last loss given to Lite::backward, detached (no host read until asked).
  Tensor last_loss;
  std::set<const optim::Optimizer*> stepped, unscaled;

  Tensor to_device(const Tensor& t) const;
  /// Under 16-mixed: a hook on each output that requires grad, so that a plain
  /// loss.backward() through it fails (see Lite::backward).
  void guard_output(const Tensor& t) const;
  /// The dtype floating outputs become, from the inputs' dtypes (ToInputDType).
  DType output_dtype(const std::vector<DType>& input_dtypes) const;
  /// Applies the scaler's update if an optimizer stepped or unscaled since the last one.
  void finish_iteration();
  void unscale(optim::Optimizer& opt);
  StepResult step(optim::Optimizer& opt);
  void warn(const std::string& line) const;
  /// Remembers the module paths of module's parameters.
  void name_parameters(nn::Module& module);
  /// "ddp": rank 0's parameters and buffers of module on every rank.
  void broadcast_module(nn::Module& module);
  /// "ddp": module's parameters added to those whose gradients backward averages.
  void average_gradients_of(nn::Module& module);
};

}  // namespace detail

/// A module set up by Lite: call it like the module (any arguments its forward takes).
template <class M>
class LiteModule {
 public:
  LiteModule() = default;
  LiteModule(std::shared_ptr<M> module, std::shared_ptr<detail::LiteCore> core)
      : module_(std::move(module)), core_(std::move(core)) {}

  template <class... Args>
  auto operator()(const Args&... args) {
    return forward(args...);
  }

  template <class... Args>
  auto forward(const Args&... args) {
    AG_CHECK(module_ && core_, "LiteModule", "not set up (use lite.setup or lite.setup_module)");
    const PrecisionPlugin& plugin = *core_->plugin;
    const OutputConversion mode = core_->options.output_conversion;
    DType out_dtype = get_default_dtype();
    if (mode == OutputConversion::ToInputDType) {
      std::vector<DType> dtypes;
      (for_each_tensor(args, [&](const Tensor& t) {
         if (t.defined() && t.is_floating_point()) dtypes.push_back(t.dtype());
       }),
       ...);
      out_dtype = core_->output_dtype(dtypes);
    }
    auto in = std::make_tuple(apply_to_tensors(args, [&](const Tensor& t) {
      return plugin.convert_input(core_->to_device(t));
    })...);
    auto out = [&] {
      ForwardContext ctx = plugin.forward_context();
      return std::apply([&](const auto&... a) { return module_->forward(a...); }, in);
    }();
    for_each_tensor(out, [&](const Tensor& t) { core_->guard_output(t); });
    if (mode == OutputConversion::None) return out;
    return apply_to_tensors(out, [&](const Tensor& t) { return PrecisionPlugin::convert_output(t, out_dtype); });
  }

  M& module() const { return *module_; }
  const std::shared_ptr<M>& module_ptr() const { return module_; }
  M* operator->() const { return module_.get(); }

 private:
  std::shared_ptr<M> module_;
  std::shared_ptr<detail::LiteCore> core_;
};

/// An optimizer set up by Lite.
class LiteOptimizer {
 public:
  LiteOptimizer() = default;
  LiteOptimizer(optim::Optimizer& opt, std::shared_ptr<detail::LiteCore> core);
  /// The precision's step: under 16-mixed, unscale (unless clip_gradients did), skip on the
  /// device when a gradient is inf or NaN. The result's bool (whether the parameters were
  /// updated) is a host sync under 16-mixed; nothing waits unless it is asked.
  StepResult step();
  void zero_grad() { optimizer().zero_grad(); }
  optim::Optimizer& optimizer() const {
    AG_CHECK(opt_ != nullptr, "LiteOptimizer", "not set up (use lite.setup or lite.setup_optimizer)");
    return *opt_;
  }
  optim::Optimizer* operator->() const { return opt_; }
  /// Steps that updated the parameters, and steps skipped for inf/NaN gradients, since
  /// setup (host syncs: the counts live on the device).
  int64_t steps_taken() const;
  int64_t steps_skipped() const;
  /// The steps skipped in a row up to the latest one (0 once a step updates the
  /// parameters): a loop that reads it now and then can stop a run that no longer
  /// recovers (a host sync).
  int64_t consecutive_skips() const;
  /// The last step's stalled updates (16-bit parameters whose nonzero update left the
  /// stored value unchanged), over all groups: a 0-dim int64 tensor on the device, read by
  /// nothing until asked. Zero under precisions with float32 parameters.
  const Tensor& stalled_count() const { return optimizer().stalled_count(); }
  /// That count over the group's 16-bit elements (a host read).
  double stalled_fraction(size_t group = 0) const { return optimizer().stalled_fraction(group); }
  /// Why the last step was skipped, read from the device now (host syncs): the gradients
  /// as the step left them (call it before zero_grad), the last loss Lite::backward saw,
  /// and the scale before and after; `limit` caps the parameters named. Not skipped (or no
  /// step yet): a report with skipped false.
  OverflowReport explain_overflow(size_t limit = 8) const;

 private:
  friend class LiteScheduler;
  friend class Lite;
  optim::Optimizer* opt_ = nullptr;
  Tensor taken_at_setup_;  // the optimizer's step_count() when set up
  Tensor skipped_;         // int64, 0-dim, on Lite's device (the parameters')
  Tensor skip_run_;        // int64, 0-dim, there too
  StepResult last_;        // the last step's result, with its scales
  std::shared_ptr<detail::LiteCore> core_;
};

/// A learning-rate schedule bound to a LiteOptimizer that follows the optimizer's real
/// steps: step() moves the schedule by the updates the optimizer applied since the last
/// call (one, or none for a step skipped for an overflow), on the device. The learning
/// rate is looked up on the device in a table of the schedule's values, which the host
/// extends ahead of need, so the host never reads the step count.
class LiteScheduler {
 public:
  LiteScheduler(LiteOptimizer& opt, optim::SchedulePtr schedule);
  /// Advances by the optimizer's real steps since the last call and sets every group's
  /// learning rate (a device tensor). No host sync.
  void step();
  /// The schedule's position: the real steps it has followed (a host sync).
  int64_t last_step() const;
  /// A group's current learning rate (a host sync).
  double last_lr(size_t group = 0) const { return opt_->lr(group); }
  /// Restores a checkpointed position.
  void set_last_step(int64_t t);
  /// The position as a 0-dim int64 tensor on the parameters' device (for checkpoints).
  const Tensor& position() const { return position_; }

 private:
  void ensure_table(int64_t last_position);
  void apply();
  optim::Optimizer* opt_;
  optim::SchedulePtr schedule_;
  std::vector<double> base_;
  Tensor position_, seen_;          // int64, 0-dim: the position, the step_count() it has seen
  std::vector<Tensor> table_;       // per group: float64 [table_len_], the rate at each position
  int64_t table_len_ = 0;
  int64_t bound_ = 0;               // host: no position beyond this can have been reached
  int64_t calls_at_bound_ = 0;      // the optimizer's step calls when bound_ was set
};

/// Batches of a DataLoader, moved to the Lite's device.
class LiteDataLoader {
 public:
  LiteDataLoader(data::DataLoader loader, std::shared_ptr<detail::LiteCore> core)
      : loader_(std::move(loader)), core_(std::move(core)) {}
  class Iterator {
   public:
    Iterator(data::DataLoader::Iterator it, const detail::LiteCore* core) : it_(std::move(it)), core_(core) {}
    data::Batch operator*() const { return {core_->to_device(it_->input), core_->to_device(it_->target)}; }
    Iterator& operator++() {
      ++it_;
      return *this;
    }
    bool operator!=(const Iterator& o) const { return it_ != o.it_; }
    bool operator==(const Iterator& o) const { return it_ == o.it_; }

   private:
    data::DataLoader::Iterator it_;
    const detail::LiteCore* core_;
  };
  Iterator begin() const { return {loader_.begin(), core_.get()}; }
  Iterator end() const { return {loader_.end(), core_.get()}; }
  int64_t num_batches() const { return loader_.num_batches(); }
  const data::DataLoader& loader() const { return loader_; }

 private:
  data::DataLoader loader_;
  std::shared_ptr<detail::LiteCore> core_;
};

/// One named thing to checkpoint: a module, an optimizer, a scheduler or a counter. Built
/// implicitly, so a state reads {{"model", model}, {"optimizer", optimizer}, {"step", step}}.
class StateItem {
 public:
  StateItem(nn::Module& module);                               // NOLINT: implicit on purpose
  template <class M>
  StateItem(const std::shared_ptr<M>& module) : StateItem(static_cast<nn::Module&>(*module)) {}  // NOLINT
  template <class M>
  StateItem(LiteModule<M>& module) : StateItem(static_cast<nn::Module&>(module.module())) {}  // NOLINT
  StateItem(optim::Optimizer& optimizer);                      // NOLINT
  StateItem(LiteOptimizer& optimizer);                         // NOLINT
  StateItem(LiteScheduler& scheduler);                         // NOLINT
  StateItem(int64_t& counter);                                 // NOLINT
  StateItem(double& value);                                    // NOLINT
  StateItem(std::string& text);                                // NOLINT

  /// Adds this item's tensors under "<name>." (counters under "<name>") and strings to the
  /// metadata.
  void save(const std::string& name, nn::StateDict& tensors, nn::Metadata& meta) const;
  /// Restores from what save() wrote; throws ag::Error naming the file and what is missing.
  void load(const std::string& name, const nn::StateDict& tensors, const nn::Metadata& meta,
            const std::string& path) const;
  /// Whether a checkpoint key (of the tensors, or of the metadata) is this item's when it
  /// is saved under `name`: "<name>.*" for modules, optimizers and schedulers, "<name>"
  /// for numbers (tensors) and text (metadata).
  bool owns(const std::string& name, const std::string& key, bool in_metadata) const;

 private:
  enum class Keys { Prefix, Tensor, Text };
  Keys keys_ = Keys::Prefix;
  template <class T>
  void bind_number(T& value, const char* what);
  std::function<void(const std::string&, nn::StateDict&, nn::Metadata&)> save_;
  std::function<void(const std::string&, const nn::StateDict&, const nn::Metadata&, const std::string&)> load_;
};
using LiteState = std::map<std::string, StateItem>;

/// The scope of Lite::no_backward_sync().
class NoBackwardSync {
 public:
  explicit NoBackwardSync(std::shared_ptr<detail::LiteCore> core);
  ~NoBackwardSync();
  NoBackwardSync(const NoBackwardSync&) = delete;
  NoBackwardSync& operator=(const NoBackwardSync&) = delete;

 private:
  std::shared_ptr<detail::LiteCore> core_;
};

class Lite {
 public:
  /// Resolves the accelerator and the precision (printing the warning line of an emulated
  /// or deprecated choice once); throws ag::Error for an unknown or unsupported choice.
  explicit Lite(LiteOptions options = {});

  Precision precision() const { return core_->decision.precision; }
  const std::string& precision_reason() const { return core_->decision.reason; }
  /// The decision as checkpoints record it: the precision, how it was chosen (from the
  /// precision string asked for), the reason, the hardware and the version; or the record
  /// of LiteOptions::recorded when this Lite carries it on.
  const PrecisionRecord& precision_record() const { return core_->record; }
  /// Precision "auto:measure": runs measure_precisions (precision_trial.h) on `model`, moved
  /// to this Lite's device, with the batches moved there too, and switches this Lite to the
  /// candidate it chose (setting float32_matmul_precision("medium") for "32-true+medium"),
  /// recorded as "auto (trial)" with the trial's table. Call it before setting anything up
  /// (under any other precision string, or after a setup, it throws). Under "ddp" every rank
  /// calls it: rank 0 measures and every rank runs its choice (the other ranks' reports
  /// hold only the chosen row).
  TrialReport measure_precision(nn::Module& model, const TrialOptimizerFactory& make_optimizer, const TrialLoss& loss,
                                const std::vector<data::Batch>& batches, const TrialOptions& options = {});
  Device device() const { return core_->device; }
  /// The devices the precision was decided for.
  const std::vector<Device>& devices() const { return core_->decision.devices; }
  /// The hardware report and the decision, several lines.
  const std::string& describe() const { return core_->description; }
  PrecisionPlugin& plugin() const { return *core_->plugin; }

  /// Sets the default dtype to the parameter dtype while a model is built in it:
  ///   { auto ctx = lite.init_module(); net = make_model(); }
  std::unique_ptr<DefaultDTypeGuard> init_module() const { return core_->plugin->module_init_context(); }
  /// The forward context (autocast under the mixed precisions) for code outside a
  /// wrapped module's forward.
  ForwardContext autocast() const { return core_->plugin->forward_context(); }

  /// Moves the module to the device and converts it per precision; the optimizer must
  /// hold the module's parameters (it sees the conversion: parameters change in place).
  template <class M>
  std::pair<LiteModule<M>, LiteOptimizer> setup(std::shared_ptr<M> module, optim::Optimizer& optimizer) {
    AG_CHECK(module != nullptr, "Lite::setup", "the module is null");
    core_->broadcast_module(*module);               // ddp: rank 0's values, before masters are made
    LiteOptimizer o = setup_optimizer(optimizer);  // then: masters from the float32 values
    return {wrap_module(std::move(module)), std::move(o)};
  }
  template <class M>
  LiteModule<M> setup_module(std::shared_ptr<M> module) {
    AG_CHECK(module != nullptr, "Lite::setup", "the module is null");
    core_->broadcast_module(*module);
    return wrap_module(std::move(module));
  }
  /// Under 16-true / bf16-true, sets the optimizer's update rounding (LiteOptions::
  /// update_rounding; under Master it makes the float32 masters from the parameters'
  /// current values: set up the optimizer before its module is converted, as setup() does,
  /// to keep the full float32 values), and its stalled count (count_stalled).
  LiteOptimizer setup_optimizer(optim::Optimizer& optimizer);
  LiteScheduler setup_scheduler(LiteOptimizer& optimizer, optim::SchedulePtr schedule) {
    return LiteScheduler(optimizer, std::move(schedule));
  }
  /// Batches moved to the device. Under "ddp" each rank gets its own shard of every epoch
  /// (DataLoaderOptions::num_shards and shard), shuffled, when the loader shuffles, from a
  /// seed rank 0 draws and shares, so that the shards of one epoch never overlap.
  LiteDataLoader setup_dataloader(data::DataLoader loader);

  Tensor to_device(const Tensor& t) const { return core_->to_device(t); }
  template <class T>
  T to_device(const T& nested) const {
    return apply_to_tensors(nested, [&](const Tensor& t) { return core_->to_device(t); });
  }

  /// Backward from the loss: scaled under 16-mixed (where a plain loss.backward() on a
  /// wrapped module's output is refused, since the scale would be silently missing).
  void backward(const Tensor& loss);
  /// Under "ddp", backward calls in this scope leave the gradients on each rank, where
  /// they accumulate; the first backward after it averages the sums. Gradient
  /// accumulation without a reduction per micro-batch (Fabric's no_backward_sync):
  ///   { auto skip = lite.no_backward_sync(); lite.backward(loss_of(micro_batch_1)); }
  ///   lite.backward(loss_of(micro_batch_2));  // averages both micro-batches' gradients
  ///   opt.step();
  /// With "single", nothing to skip.
  [[nodiscard]] NoBackwardSync no_backward_sync() const { return NoBackwardSync(core_); }
  /// Clips the gradients of the module's parameters to a total 2-norm of max_norm, after
  /// unscaling them under 16-mixed, on the device; returns the norm before clipping
  /// (unscaled) as a 0-dim float32 tensor there (reading it is a host sync).
  Tensor clip_gradients(nn::Module& module, LiteOptimizer& optimizer, double max_norm);
  template <class M>
  Tensor clip_gradients(LiteModule<M>& module, LiteOptimizer& optimizer, double max_norm) {
    return clip_gradients(static_cast<nn::Module&>(module.module()), optimizer, max_norm);
  }

  /// Seeds ampgrad's generator (initialisation, shuffling, dropout).
  void seed_everything(uint64_t seed) const;
  /// The strategy ("single" or "ddp"), this process's rank in the job, the number of
  /// processes, and the rank among those on this machine (0, 1, 0 for "single").
  const std::string& strategy() const { return core_->options.strategy; }
  int rank() const { return core_->group ? core_->group->rank() : 0; }
  int world_size() const { return core_->group ? core_->group->size() : 1; }
  int local_rank() const { return core_->group ? core_->group->local_rank() : 0; }
  bool is_global_zero() const { return rank() == 0; }
  /// The job's collectives (distributed.h); for "single", those of a job of one: barrier,
  /// all_reduce and broadcast leave t as it is, all_gather returns a copy ([1] for 0-dim).
  void barrier() const;
  void all_reduce(const Tensor& t, dist::ReduceOp op = dist::ReduceOp::Sum) const;
  void broadcast(const Tensor& t, int src = 0) const;
  Tensor all_gather(const Tensor& t) const;

  /// Prints to standard output, on rank 0 only.
  template <class... A>
  void print(const A&... parts) const {
    if (!is_global_zero()) return;
    std::ostringstream os;
    (os << ... << parts);
    std::printf("%s\n", os.str().c_str());
    std::fflush(stdout);
  }

  /// The loss scale (1 unless 16-mixed) and the steps skipped for inf/NaN gradients (host
  /// syncs).
  double loss_scale() const { return core_->plugin->loss_scale(); }
  int64_t skipped_steps() const;

  /// Writes every item of `state` plus the precision plugin's state (the grad scaler's),
  /// the precision record (precision_record()) and the random generator's position to one
  /// safetensors file, atomically. Under
  /// "ddp" rank 0 writes and every rank returns once the file is there (the ranks hold
  /// the same parameters).
  void save(const std::string& path, const LiteState& state);
  /// Restores every item of `state` from a file written by save(), plus the plugin's state
  /// and the generator's position. Missing items are an error naming them; so are, when
  /// `strict`, keys in the file that belong to no item (as for a module's strict load).
  /// Every number is checked as the constructors check it; errors name the file and key.
  /// A checkpoint recorded under another precision than this Lite's still loads (the
  /// values are converted as a module's load converts them), with one warning line naming
  /// both precisions and how to keep the recorded one.
  void load(const std::string& path, const LiteState& state, bool strict = true);

 private:
  void convert(nn::Module& module);
  // Converts in place (the optimizer's parameters are the module's) and, under ddp,
  // registers the parameters for gradient averaging.
  template <class M>
  LiteModule<M> wrap_module(std::shared_ptr<M> module) {
    convert(*module);
    core_->name_parameters(*module);
    core_->average_gradients_of(*module);
    return LiteModule<M>(std::move(module), core_);
  }
  std::shared_ptr<detail::LiteCore> core_;
};

}  // namespace ampgrad
