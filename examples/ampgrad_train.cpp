// ampgrad-train: trains an MLP, a CNN (Fashion-MNIST) or a small char-level GPT and reports
// what a person wants to see: the hardware, the precision, a progress bar per epoch,
// per-epoch loss and accuracy, and a closing summary. With --strategy ddp it is one process
// of a data-parallel job started by mpirun: every rank trains on its shard of each batch
// source, the figures printed (by rank 0 alone) are the job's, and rank 0 writes the
// checkpoints and the JSON.
#include <ampgrad/ampgrad.h>
#include <omp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string fmt_time(double s) {
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", int(s / 3600), int(s / 60) % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s / 60), int(s) % 60);
  else std::snprintf(buf, sizeof buf, "%.1fs", s);
  return buf;
}

std::string fmt_count(double v) {
  std::ostringstream os;
  const long long n = (long long)(v + 0.5);
  std::string s = std::to_string(n);
  for (int i = int(s.size()) - 3; i > 0; i -= 3) s.insert(size_t(i), ",");
  return s;
}

struct Options {
  std::string model = "mlp";
  int epochs = 5;
  int64_t batch_size = 128;
  double lr = 1e-3;
  uint64_t seed = 0;
  int threads = 0;
  std::string data;
  std::string save, resume, json;
  int keep = 3;
  int64_t max_skip_run = 50;
  std::string precision;  // empty: AMPGRAD_PRECISION if set, else "auto"
  bool precision_given = false;         // by --precision or AMPGRAD_PRECISION: it wins over a checkpoint's record
  bool matmul_precision_given = false;  // by --float32-matmul-precision: it wins over the record's
  bool redecide_precision = false;
  std::string accelerator = "auto";
  std::string strategy = "single";
  std::string output_conversion = "to-default";
  std::string schedule = "cosine";
  std::string matmul_precision = "highest";
  bool quiet = false;
  // gpt
  std::string preset = "small";
  int64_t layers = 2, heads = 4, width = 128, block_size = 64, steps_per_epoch = 200, sample_len = 200;
  double val_fraction = 0.1;  // gpt: the end of the text held out for the validation loss
  double min_lr = 0;          // where the cosine schedule ends
  std::string update_rounding = "master";
  double stalled_warn = 0.25;  // 16-bit true precisions: warn once past this stalled fraction
  int64_t val_batches = 8;
};

// One line per epoch, redrawn in place on a terminal, printed once at the end otherwise.
// Under ddp it counts the samples of the whole job (every rank runs as many steps).
class Progress {
 public:
  Progress(int epoch, int epochs, int64_t total, bool enabled, const char* unit)
      : epoch_(epoch), epochs_(epochs), total_(total), enabled_(enabled), tty_(isatty(1)), unit_(unit),
        t0_(Clock::now()) {}
  void update(int64_t done, int64_t samples, double loss, bool final = false) {
    if (!enabled_ || (!tty_ && !final)) return;
    const double el = seconds_since(t0_);
    if (!final && el - last_ < 0.1) return;
    last_ = el;
    const int width = 24, fill = int(width * done / std::max<int64_t>(total_, 1));
    const double rate = samples / std::max(el, 1e-9);
    const double left = done ? el * double(total_ - done) / double(done) : 0;
    std::printf("\repoch %d/%d [%s%s] %lld/%lld  %s %s/s  loss %.4f  %s %s ", epoch_, epochs_,
                std::string(size_t(fill), '=').c_str(), std::string(size_t(width - fill), ' ').c_str(),
                (long long)done, (long long)total_, fmt_count(rate).c_str(), unit_, loss, final ? "took" : "left",
                fmt_time(final ? el : left).c_str());
    if (final) std::printf("\n");
    std::fflush(stdout);
  }

 private:
  int epoch_, epochs_;
  int64_t total_;
  bool enabled_, tty_;
  const char* unit_;
  Clock::time_point t0_;
  double last_ = -1;
};

// Test accuracy through the wrapped module, so evaluation runs in the training precision.
// Under ddp each rank scores its shard and the counts are summed.
template <class M>
double accuracy(ag::LiteModule<M>& model, ag::Lite& lite, const ag::data::TensorDataset& test) {
  ag::NoGradGuard ng;
  model->eval();
  ag::data::DataLoader loader(std::shared_ptr<const ag::data::Dataset>(&test, [](const ag::data::Dataset*) {}),
                              {.batch_size = 1000});
  int64_t correct = 0, seen = 0;
  for (const auto& b : lite.setup_dataloader(loader)) {
    ag::Tensor pred = ag::argmax(model(b.input), 1);
    correct += ag::sum(ag::eq(pred, b.target)).item<int64_t>();
    seen += b.target.size(0);
  }
  model->train();
  ag::Tensor counts = ag::from_vector(std::vector<int64_t>{correct, seen}, {2});
  lite.all_reduce(counts, ag::dist::ReduceOp::Sum);
  const auto c = counts.to_vector<int64_t>();
  return double(c[0]) / double(std::max<int64_t>(c[1], 1));
}

void print_hardware(const ag::Lite& lite) {
  std::printf("threads  : %d\n%s\n", omp_get_max_threads(), lite.describe().c_str());
}

// Numeric checks whose message names the value and what was expected: CLI11's own say
// "Value 0 not in range 0.000000 to 1797693..." (their upper end is DBL_MAX), and its
// conversion takes "-1" for an unsigned option as 2^64 - 1 and lets a number too large for
// the option's type through. CLI11 puts the option's name in front.
enum class Sign { Positive, NonNegative };
template <class T>
CLI::Validator number(Sign sign) {
  const std::string what = std::string(sign == Sign::Positive ? "a positive " : "a non-negative ") +
                           (std::is_integral_v<T> ? "integer" : "number");
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        T v{};
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec == std::errc::result_out_of_range) {
          if constexpr (std::is_integral_v<T>)
            return "\"" + s + "\" is out of range (at most " + std::to_string(std::numeric_limits<T>::max()) + ")";
          return "\"" + s + "\" is out of range";
        }
        const bool ok = ec == std::errc() && end == s.data() + s.size() && std::isfinite(double(v)) &&
                        (sign == Sign::Positive ? v > 0 : v >= 0);
        return ok ? std::string() : "\"" + s + "\" is not " + what;
      },
      what);
}
template <class T>
CLI::Option* add_number(CLI::App& app, const std::string& name, T& value, const std::string& help, Sign sign) {
  return app.add_option(name, value, help)->check(number<T>(sign));
}

// A string option checked by the library's own parser (which lists the allowed values).
template <class Parse>
CLI::Validator parsed_by(Parse parse, const std::string& description) {
  return CLI::Validator(
      [parse](std::string& s) -> std::string {
        try {
          parse(s);
          return {};
        } catch (const ag::Error& e) {
          return e.what();
        }
      },
      description);
}

void add_options(CLI::App& app, Options& o) {
  app.add_option("--model", o.model, "mlp, cnn (Fashion-MNIST) or gpt (char-level text)")
      ->check(CLI::IsMember({"mlp", "cnn", "gpt"}));
  add_number(app, "--epochs", o.epochs, "epochs to train", Sign::Positive);
  add_number(app, "--batch-size", o.batch_size, "samples per batch", Sign::Positive);
  add_number(app, "--lr", o.lr, "AdamW learning rate", Sign::Positive);
  add_number(app, "--min-lr", o.min_lr, "the learning rate the cosine schedule ends at (default 0)", Sign::NonNegative);
  app.add_option("--update-rounding", o.update_rounding,
                 "16-true / bf16-true: how the 16-bit weights store their updates: master (default: float32 master "
                 "weights), nearest (small updates are lost), stochastic, compensated (docs/precision.md)")
      ->check([](const std::string& v) {
        try {
          ag::parse_update_rounding(v);
          return std::string();
        } catch (const ag::Error& e) {
          return e.message();
        }
      });
  app.add_option("--stalled-warn", o.stalled_warn,
                 "16-true / bf16-true: warn once when an epoch loses more than this fraction of the 16-bit weights' "
                 "updates to rounding (default 0.25; 1 never)")
      ->check(CLI::Range(0.0, 1.0));
  add_number(app, "--seed", o.seed, "seed for initialisation, shuffling and dropout", Sign::NonNegative);
  add_number(app, "--threads", o.threads, "CPU threads (default: all cores)", Sign::NonNegative);
  app.add_option("--data", o.data, "dataset directory (mlp, cnn) or text file (gpt)");
  app.add_option("--save", o.save, "folder to write a checkpoint to after each epoch (epoch-NNNN.safetensors)");
  add_number(app, "--keep", o.keep, "checkpoints --save keeps, the newest", Sign::Positive);
  app.add_option("--resume", o.resume,
                 "continue from this checkpoint file, or from the newest checkpoint in this folder that loads");
  add_number(app, "--max-skip-run", o.max_skip_run,
             "16-mixed: stop after this many optimizer steps skipped in a row for inf/NaN gradients (0: never)",
             Sign::NonNegative);
  app.add_option("--precision", o.precision,
                 "auto (default; AMPGRAD_PRECISION when set), auto:measure (a short trial of each candidate on "
                 "this model decides), 32-true, 64-true, 16-mixed, bf16-mixed, 16-true, bf16-true");
  app.add_flag("--redecide-precision", o.redecide_precision,
               "with --resume: decide the precision again (--precision, else auto) instead of keeping the one "
               "the checkpoint recorded");
  app.add_option("--accelerator", o.accelerator, "auto (default), cpu, cuda, cuda:N");
  app.add_option("--strategy", o.strategy,
                 "single (default) or ddp: one process of a data-parallel job started by mpirun -np N; "
                 "--batch-size is per process")
      ->check(CLI::IsMember({"single", "ddp"}));
  app.add_option("--output-conversion", o.output_conversion,
                 "dtype of the model's floating outputs: to-default (float32), to-input-dtype or none")
      ->check(parsed_by(ag::parse_output_conversion, "to-default, to-input-dtype or none"));
  app.add_option("--schedule", o.schedule, "learning rate over the run: cosine (decays to 0 by the last step) or constant")
      ->check(CLI::IsMember({"cosine", "constant"}));
  app.add_option("--float32-matmul-precision", o.matmul_precision,
                 "float32 products: highest (default), high or medium (bfloat16 products where the hardware "
                 "has them; ag::set_float32_matmul_precision)")
      ->check(CLI::IsMember({"highest", "high", "medium"}));
  app.add_flag("--quiet", o.quiet, "print only the summary");
  app.add_option("--json", o.json, "write per-epoch figures to this file");
  app.add_option("--preset", o.preset,
                 "gpt: small (2 layers, 4 heads, width 128, context 64; default) or nanogpt (6, 6, 384, 256: "
                 "nanoGPT's Shakespeare character model); --layers, --heads, --width, --block-size override it")
      ->check(CLI::IsMember({"small", "nanogpt"}));
  add_number(app, "--layers", o.layers, "gpt: transformer blocks", Sign::Positive);
  add_number(app, "--heads", o.heads, "gpt: attention heads", Sign::Positive);
  add_number(app, "--width", o.width, "gpt: embedding width", Sign::Positive);
  add_number(app, "--block-size", o.block_size, "gpt: context length", Sign::Positive);
  add_number(app, "--steps-per-epoch", o.steps_per_epoch, "gpt: batches per epoch", Sign::Positive);
  add_number(app, "--sample-length", o.sample_len, "gpt: characters generated after training", Sign::NonNegative);
  app.add_option("--val-fraction", o.val_fraction,
                 "gpt: the fraction at the end of the text held out for the validation loss, from 0 (none) to 0.5")
      ->check(CLI::Range(0.0, 0.5));
  add_number(app, "--val-batches", o.val_batches, "gpt: batches of held-out text the validation loss averages",
             Sign::Positive);
}

// The preset's sizes, where no option gave one.
void apply_preset(const CLI::App& app, Options& o) {
  const ag::nn::GPTConfig p = ag::nn::gpt_preset(o.preset);
  if (app.count("--layers") == 0) o.layers = p.layers;
  if (app.count("--heads") == 0) o.heads = p.heads;
  if (app.count("--width") == 0) o.width = p.width;
  if (app.count("--block-size") == 0) o.block_size = p.block_size;
}

// The process-wide settings: threads, float32 products, and the precision AMPGRAD_PRECISION
// gives where --precision did not.
void configure_process(Options& o) {
  if (o.threads > 0) omp_set_num_threads(o.threads);
  ag::set_float32_matmul_precision(o.matmul_precision);
  o.precision_given = !o.precision.empty();
  if (o.precision.empty()) {
    const char* env = std::getenv("AMPGRAD_PRECISION");
    o.precision_given = env && *env;
    o.precision = o.precision_given ? env : "auto";
  }
}

// The precision a resumed run takes from its checkpoint's record (docs/precision.md, "The
// decision is recorded"; ag::precision_on_resume): the recorded one unless --precision (or
// AMPGRAD_PRECISION) or --redecide-precision asks otherwise.
class PrecisionOnResume {
 public:
  // Reads the record of --resume (a file, or the newest checkpoint of a folder with a
  // readable record) and sets o.precision, and the float32 products when kept and not given.
  explicit PrecisionOnResume(Options& o) {
    if (o.resume.empty()) return;
    if (!read_record(o.resume)) return;
    const std::optional<std::string> requested = o.precision_given ? std::optional(o.precision) : std::nullopt;
    decision_ = ag::precision_on_resume(*recorded_, requested, o.redecide_precision, o.accelerator, ag::hw::query());
    o.precision = decision_.precision;
    if (!decision_.float32_matmul.empty() && !o.matmul_precision_given) {
      o.matmul_precision = decision_.float32_matmul;
      ag::set_float32_matmul_precision(o.matmul_precision);
    }
  }

  // The record Lite carries on: the checkpoint's, when its precision is kept.
  std::optional<ag::PrecisionRecord> kept() const {
    return decision_.choice == ag::ResumePrecision::Choice::Kept ? recorded_ : std::nullopt;
  }

  // One line: the precision this run trains in, and how it relates to the record.
  std::string line(const ag::Lite& lite) const {
    return recorded_ ? decision_.line(*recorded_, checkpoint_, lite.precision()) : std::string();
  }

  // For --json: the checkpoint's record and what this run did with it.
  nlohmann::json json(const ag::Lite& lite) const {
    if (!recorded_) return nullptr;
    return {{"checkpoint", checkpoint_},
            {"recorded", recorded_->precision_text()},
            {"recorded_how", recorded_->how},
            {"choice", decision_.choice_name()},
            {"emulated_here", decision_.emulated_here},
            {"line", line(lite)}};
  }

 private:
  bool read_record(const std::string& resume) {
    std::error_code ec;
    std::vector<std::string> candidates;
    if (std::filesystem::is_directory(resume, ec))
      for (const auto& e : ag::CheckpointFolder(resume).list()) candidates.push_back(e.path);
    else candidates.push_back(resume);
    for (const std::string& path : candidates) {
      try {
        recorded_ = ag::read_precision_record(path);
        checkpoint_ = path;
        return true;
      } catch (const ag::Error&) {  // the load names what is wrong with it
      }
    }
    return false;
  }

  std::optional<ag::PrecisionRecord> recorded_;
  std::string checkpoint_;
  ag::ResumePrecision decision_;
};

nlohmann::json record_json(const ag::PrecisionRecord& r) {
  return {{"precision", ag::precision_name(r.precision)},
          {"float32_matmul_precision", r.float32_matmul},
          {"how", r.how},
          {"reason", r.reason},
          {"hardware", r.hardware_text()},
          {"version", r.version},
          {"trial", r.trial}};
}

ag::LiteOptions lite_options(const Options& o, std::optional<ag::PrecisionRecord> recorded) {
  return {.accelerator = o.accelerator,
          .precision = o.precision,
          .strategy = o.strategy,
          .output_conversion = ag::parse_output_conversion(o.output_conversion),
          .update_rounding = ag::parse_update_rounding(o.update_rounding),
          .recorded = std::move(recorded)};
}

// Seeds the run, silences every rank but 0 and prints the hardware, and the precision's
// relation to a resumed checkpoint's record.
void start_run(ag::Lite& lite, Options& o, const PrecisionOnResume& on_resume) {
  lite.seed_everything(o.seed);
  if (!lite.is_global_zero()) o.quiet = true;  // rank 0 speaks for the job
  if (!o.quiet) {
    print_hardware(lite);
    if (const std::string line = on_resume.line(lite); !line.empty()) std::printf("%s\n", line.c_str());
    if (o.matmul_precision != "highest") std::printf("float32 products: %s\n", o.matmul_precision.c_str());
  }
}

// The data and the network of --model: images and an MLP or CNN, or text and a GPT.
struct Workload {
  std::shared_ptr<ag::data::TensorDataset> train, test;
  std::shared_ptr<ag::data::CharDataset> text;
  std::shared_ptr<ag::nn::Module> net;
  std::shared_ptr<ag::nn::GPT> gpt_model;
};

Workload load_text_and_gpt(const Options& o) {
  Workload w;
  w.text = std::make_shared<ag::data::CharDataset>(
      ag::data::read_text(o.data.empty() ? ag::data::kFortunesDir : o.data), o.block_size);
  w.gpt_model = std::make_shared<ag::nn::GPT>(ag::nn::GPTConfig{.vocab_size = w.text->vocab_size(),
                                                                .block_size = o.block_size,
                                                                .layers = o.layers,
                                                                .heads = o.heads,
                                                                .width = o.width});
  w.net = w.gpt_model;
  if (!o.quiet)
    std::printf("data     : %lld characters, vocabulary %lld\n", (long long)(w.text->size() + o.block_size),
                (long long)w.text->vocab_size());
  return w;
}

Workload load_images_and_net(const Options& o) {
  Workload w;
  const std::string dir = o.data.empty() ? ag::data::kFashionMnistDir : o.data;
  w.train = ag::data::fashion_mnist(true, dir);
  w.test = ag::data::fashion_mnist(false, dir);
  w.net = o.model == "mlp" ? std::shared_ptr<ag::nn::Module>(ag::nn::make_mlp()) : ag::nn::make_cnn();
  if (!o.quiet)
    std::printf("data     : Fashion-MNIST, %lld train / %lld test images\n", (long long)w.train->size(),
                (long long)w.test->size());
  return w;
}

Workload load_workload(const ag::Lite& lite, const Options& o) {
  auto init = lite.init_module();  // parameters built in the precision's dtype, until reset
  Workload w = o.model == "gpt" ? load_text_and_gpt(o) : load_images_and_net(o);
  init.reset();
  if (!o.quiet)
    std::printf("model    : %s, %s parameters; AdamW lr %g (%s), batch %lld, seed %llu\n\n", o.model.c_str(),
                fmt_count(double(w.net->num_parameters())).c_str(), o.lr, o.schedule.c_str(), (long long)o.batch_size,
                (unsigned long long)o.seed);
  return w;
}

// --precision auto:measure: a trial of the candidate precisions on this model and its first
// batches decides, before the optimizer is set up (Lite::measure_precision); the table is
// printed and goes into the checkpoints' record.
std::optional<ag::TrialReport> measure_if_asked(ag::Lite& lite, const Options& o, const PrecisionOnResume& on_resume,
                                                const Workload& w) {
  if (o.precision != "auto:measure" || on_resume.kept()) return std::nullopt;
  const ag::data::Dataset& ds = w.text ? static_cast<const ag::data::Dataset&>(*w.text) : *w.train;
  std::vector<ag::data::Batch> batches;
  for (int64_t k = 0; k < 4; ++k) {
    std::vector<int64_t> idx(size_t(o.batch_size));
    for (int64_t j = 0; j < o.batch_size; ++j) idx[size_t(j)] = (k * o.batch_size + j) % ds.size();
    batches.push_back(ds.get_batch(idx));
  }
  const int64_t vocab = w.text ? w.text->vocab_size() : 0;
  const auto loss = [vocab](ag::nn::Module& m, const ag::data::Batch& b) {
    const ag::Tensor out = m.forward(b.input);
    return vocab ? ag::cross_entropy(out.view({-1, vocab}), b.target.view({-1})) : ag::cross_entropy(out, b.target);
  };
  const double lr = o.lr;
  const auto make_optimizer = [lr](ag::nn::Module& m) -> std::unique_ptr<ag::optim::Optimizer> {
    return std::make_unique<ag::optim::AdamW>(m.parameters(), ag::optim::AdamWOptions{.lr = lr});
  };
  ag::TrialReport r = lite.measure_precision(*w.net, make_optimizer, loss, batches);
  if (lite.is_global_zero() && !o.quiet)
    std::printf("precision trial (auto:measure):\n%s\nprecision: %s, chosen by the trial\n\n", r.table().c_str(),
                r.chosen().name().c_str());
  return r;
}

// For --json: the trial whole, a row per candidate with every measured figure (null where
// not measured) and the rule's verdict on it.
nlohmann::json trial_json(const std::optional<ag::TrialReport>& r) {
  if (!r) return nullptr;
  const auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < r->rows.size(); ++i) {
    const ag::TrialRow& t = r->rows[i];
    const std::string rejected = i < r->decision.rejected.size() ? r->decision.rejected[i] : std::string();
    rows.push_back({{"candidate", t.candidate.name()},
                    {"chosen", i == r->decision.chosen},
                    {"native", t.native},
                    {"support", t.support},
                    {"measured", t.measured},
                    {"note", t.note},
                    {"steps", t.steps},
                    {"median_step_seconds", num(t.median_step_seconds)},
                    {"step_seconds", t.step_seconds},
                    {"peak_bytes", t.peak_bytes},
                    {"final_loss", num(t.final_loss)},
                    {"loss_rel_diff", num(t.loss_rel_diff)},
                    {"min_grad_cosine", num(t.min_grad_cosine)},
                    {"max_grad_rel_error", num(t.max_grad_rel_error)},
                    {"skipped_steps", t.skipped_steps},
                    {"rejected", rejected}});
  }
  return {{"chosen", r->chosen().name()}, {"reason", r->decision.reason}, {"rows", rows}, {"table", r->table()}};
}

// One run from the optimizer's setup to the summary: the epochs share the model, optimizer,
// schedule, checkpoints and the counters here. Not copyable: the checkpoint state refers to
// its members.
class Training {
 public:
  Training(ag::Lite& lite, const Options& o, Workload w)
      : lite_(lite),
        o_(o),
        w_(std::move(w)),
        gpt_(o.model == "gpt"),
        world_(lite.world_size()),
        adamw_(w_.net->parameters(), {.lr = o.lr}),
        setup_(lite.setup(w_.net, adamw_)),
        model_(setup_.first),
        opt_(setup_.second),
        steps_per_epoch_(steps_per_epoch()),
        sched_(make_schedule()),
        kind_(o.model) {
    if (!o_.save.empty()) ckpts_.emplace(o_.save, ag::CheckpointFolderOptions{.keep = o_.keep});
  }
  Training(const Training&) = delete;
  Training& operator=(const Training&) = delete;

  // A fresh run never writes over another run's checkpoints: it would replace them epoch by epoch.
  void refuse_to_overwrite_checkpoints() const {
    if (ckpts_ && o_.resume.empty() && !ckpts_->list().empty())
      AG_ERROR("ampgrad-train", o_.save, " already holds checkpoints (the newest is ", ckpts_->list().front().path,
               "): continue that run with --resume ", o_.save, ", or save to another folder");
  }

  // Loads --resume (a file, or the newest checkpoint in a folder that loads), if given.
  void resume_if_asked() {
    if (!o_.resume.empty()) {
      std::error_code ec;
      if (std::filesystem::is_directory(o_.resume, ec)) resume_from_folder();
      else resume_from_file();
      if (!o_.quiet) std::printf("resumed  : %s after epoch %lld\n\n", last_good_.c_str(), (long long)epochs_done_);
    }
    start_epoch_ = int(epochs_done_);
    step_ = int64_t(start_epoch_) * steps_per_epoch_;
  }

  void train_epochs() {
    const auto t_all = Clock::now();
    for (int epoch = start_epoch_ + 1; epoch <= o_.epochs; ++epoch) train_epoch(epoch);
    total_seconds_ = seconds_since(t_all);
  }

  void print_summary() const {
    std::printf("\nsummary: %s, %d epochs in %s, mean %s %s/s", o_.model.c_str(), o_.epochs - start_epoch_,
                fmt_time(total_seconds_).c_str(), fmt_count(mean_rate()).c_str(), gpt_ ? "tokens" : "samples");
    if (!gpt_) std::printf(", best test accuracy %.2f%%", 100 * best_);
    std::printf(" (precision %s", ag::precision_name(lite_.precision()));
    if (world_ > 1) std::printf(", ddp over %d processes", world_);
    if (lite_.skipped_steps()) std::printf(", %lld steps skipped for overflow", (long long)lite_.skipped_steps());
    std::printf(")\n");
  }

  // The GPT's text after training (--sample-length characters).
  void print_sample() const {
    if (!gpt_) return;
    auto prompt = w_.text->encode("\n");
    auto out = w_.gpt_model->generate(prompt, o_.sample_len, 0.8, o_.seed);
    std::printf("\nsample:\n%s\n", w_.text->decode(out).c_str());
  }

  void write_json(const PrecisionOnResume& on_resume, const std::optional<ag::TrialReport>& trial) const {
    if (o_.json.empty()) return;
    std::ofstream f(o_.json);
    f << nlohmann::json{{"model", o_.model},
                        {"precision", ag::precision_name(lite_.precision())},
                        {"precision_reason", lite_.precision_reason()},
                        {"precision_record", record_json(lite_.precision_record())},
                        {"precision_on_resume", on_resume.json(lite_)},
                        {"precision_trial", trial_json(trial)},
                        {"float32_matmul_precision", o_.matmul_precision},
                        {"update_rounding", o_.update_rounding},
                        {"memory", memory_json()},
                        {"skipped_steps", lite_.skipped_steps()},
                        {"strategy", o_.strategy},
                        {"world_size", world_},
                        {"epochs", log_},
                        {"best_test_accuracy", best_},
                        {"mean_rate", mean_rate()}}
             .dump(2)
      << "\n";
    AG_CHECK(f.good(), "ampgrad-train", "cannot write ", o_.json);
  }

 private:
  // What one epoch has done so far.
  struct Tally {
    int epoch;
    double loss_sum = 0;
    int64_t batches = 0, finite_batches = 0, samples = 0;
    double mean_loss() const {
      return finite_batches ? loss_sum / double(finite_batches) : std::numeric_limits<double>::quiet_NaN();
    }
  };

  int64_t steps_per_epoch() const {
    if (gpt_) return o_.steps_per_epoch;
    const int64_t shard = (w_.train->size() + world_ - 1) / world_;  // the samples of each rank per epoch
    return (shard + o_.batch_size - 1) / o_.batch_size;
  }

  // The schedule follows the optimizer's real steps (a step skipped for an overflow
  // does not advance it) and is checkpointed, so a resumed run continues the curve.
  ag::LiteScheduler make_schedule() {
    return lite_.setup_scheduler(
        opt_, o_.schedule == "cosine"
                  ? ag::optim::CosineAnnealing(
                        {.t_max = std::max<int64_t>(1, steps_per_epoch_ * o_.epochs), .eta_min = o_.min_lr})
                  : ag::optim::StepDecay({.step_size = 1, .gamma = 1.0}));
  }

  void check_model_kind(const std::string& path, const ag::nn::Metadata& meta) const {
    const auto it = meta.find("model_kind");
    AG_CHECK(it != meta.end() && it->second == o_.model, "ampgrad-train", path, " holds a ",
             it != meta.end() ? it->second : std::string("?"), " checkpoint, not ", o_.model);
  }

  void resume_from_folder() {
    const auto r = ag::CheckpointFolder(o_.resume).load_newest(
        lite_, state_, [&](const std::string& path, const ag::nn::Metadata& meta) { check_model_kind(path, meta); });
    // Said even with --quiet: the run continues from an older point than the folder's newest file.
    for (const auto& skip : r.skipped)
      std::fprintf(stderr, "warning: skipped the checkpoint %s: %s\n", skip.path.c_str(), skip.reason.c_str());
    last_good_ = r.path;
  }

  void resume_from_file() {
    check_model_kind(o_.resume, ag::nn::load_metadata(o_.resume));
    lite_.load(o_.resume, state_);
    last_good_ = o_.resume;
  }

  void train_epoch(int epoch) {
    model_->train();
    const auto t0 = Clock::now();
    Tally t{.epoch = epoch};
    const int64_t skipped_before = opt_.steps_skipped();
    if (gpt_) train_gpt_epoch(t);
    else train_image_epoch(t);
    const double train_time = seconds_since(t0);
    count_job_samples(t);
    total_samples_ += double(t.samples);
    total_train_time_ += train_time;
    report_epoch(t, train_time, opt_.steps_skipped() - skipped_before);
    save_checkpoint(epoch);
  }

  void train_gpt_epoch(Tally& t) {
    Progress bar(t.epoch, o_.epochs, o_.steps_per_epoch, !o_.quiet, "tokens");
    for (int64_t i = 0; i < o_.steps_per_epoch; ++i) {
      // Every rank draws the job's batch (so the generators stay equal) and takes its part.
      auto all = ag::randint(0, train_positions(), {o_.batch_size * world_}).to_vector<int64_t>();
      const auto first = all.begin() + lite_.rank() * o_.batch_size;
      auto b = w_.text->get_batch(std::vector<int64_t>(first, first + o_.batch_size));
      ag::Tensor logits = model_(lite_.to_device(b.input));
      const int64_t V = w_.text->vocab_size();
      train_on(ag::cross_entropy(logits.view({-1, V}), lite_.to_device(b.target).view({-1})),
               o_.batch_size * o_.block_size, t);
      bar.update(i + 1, t.samples * world_, t.mean_loss());
    }
    bar.update(o_.steps_per_epoch, t.samples * world_, t.mean_loss(), true);
  }

  void train_image_epoch(Tally& t) {
    auto loader =
        lite_.setup_dataloader(ag::data::DataLoader(w_.train, {.batch_size = o_.batch_size, .shuffle = true}));
    Progress bar(t.epoch, o_.epochs, loader.num_batches(), !o_.quiet, "samples");
    for (const auto& b : loader) {
      train_on(ag::cross_entropy(model_(b.input), b.target), b.input.size(0), t);
      bar.update(t.batches, t.samples * world_, t.mean_loss());
    }
    bar.update(loader.num_batches(), t.samples * world_, t.mean_loss(), true);
  }

  // One optimisation step on a batch's loss, shared by both kinds of epoch. The loss is read
  // after the step is queued, so the host waits only for work already on its way.
  void train_on(const ag::Tensor& loss, int64_t batch_samples, Tally& t) {
    opt_.zero_grad();
    lite_.backward(loss);
    opt_.step();
    count_stalled();
    sched_.step();
    ++step_;
    ++t.batches;
    const double value = job_loss(loss);
    if (std::isfinite(value)) {
      t.loss_sum += value;
      ++t.finite_batches;
    } else if (!scaled()) {
      stop_on_loss(value, t);
    }
    stop_on_skip_run(t.epoch);
    t.samples += batch_samples;
  }

  // Under ddp the job's mean loss, so that every rank takes the same decisions.
  double job_loss(const ag::Tensor& loss) {
    if (world_ <= 1) return loss.item<double>();
    ag::Tensor shared = loss.detach().to(ag::kCPU).to(ag::kFloat64).reshape({1}).clone();
    lite_.all_reduce(shared, ag::dist::ReduceOp::Avg);
    return shared.item<double>();
  }

  // Without a loss scale nothing skips the step: the parameters have taken it.
  [[noreturn]] void stop_on_loss(double value, const Tally& t) const {
    std::ostringstream why;
    why << "the loss is "
        << (std::isnan(value) ? "NaN"
            : value > 0       ? "inf"
                              : "-inf")
        << " at step " << step_ << " (epoch " << t.epoch << ", batch " << t.batches << ")";
    stop(why.str());
  }

  // A skipped step halves the loss scale; a long run of them means it will not recover.
  void stop_on_skip_run(int epoch) const {
    if (!scaled() || o_.max_skip_run <= 0) return;
    const int64_t run = opt_.consecutive_skips();
    if (run < o_.max_skip_run) return;
    std::ostringstream why;
    why << run << " optimizer steps in a row were skipped for inf/NaN gradients (steps " << step_ - run + 1 << " to "
        << step_ << ", epoch " << epoch << "; --max-skip-run " << o_.max_skip_run << ", loss scale now "
        << lite_.loss_scale() << "); the last " << opt_.explain_overflow().describe();
    stop(why.str());
  }

  // Why a run stopped early, and what it leaves behind.
  [[noreturn]] void stop(const std::string& why) const {
    const std::string left = !last_good_.empty() ? "the last checkpoint, " + last_good_ + ", is kept"
                             : ckpts_            ? "no checkpoint was written yet"
                                                 : "nothing was saved (no --save)";
    AG_ERROR("ampgrad-train", why, " under ", ag::precision_name(lite_.precision()), "; training stopped; ", left);
  }

  // The job's samples (the losses summed in the epoch are the job's already).
  void count_job_samples(Tally& t) {
    if (world_ <= 1) return;
    ag::Tensor all = ag::scalar_tensor(t.samples);
    lite_.all_reduce(all, ag::dist::ReduceOp::Sum);
    t.samples = all.item<int64_t>();
  }

  // The epoch's line (with the test accuracy for the image models) and its JSON record.
  void report_epoch(const Tally& t, double train_time, int64_t skipped) {
    nlohmann::json rec = {{"epoch", t.epoch},
                          {"train_loss", t.mean_loss()},
                          {"seconds", train_time},
                          {"steps", t.batches},
                          {"skipped_steps", skipped},
                          {"lr", sched_.last_lr()},  // after the epoch's last step: the schedule's course
                          {gpt_ ? "tokens_per_s" : "samples_per_s", double(t.samples) / train_time}};
    std::ostringstream line;
    line << "epoch " << t.epoch << ": train loss " << std::fixed << std::setprecision(4) << t.mean_loss();
    if (!gpt_) {
      const double acc = accuracy(model_, lite_, *w_.test);
      best_ = std::max(best_, acc);
      rec["test_accuracy"] = acc;
      line << ", test accuracy " << std::setprecision(2) << 100 * acc << "%";
    } else if (held_out() > 0) {
      const double val = validation_loss();
      rec["val_loss"] = val;
      line << ", val loss " << val;
    }
    if (skipped) line << ", " << skipped << " of " << t.batches << " steps skipped for overflow";
    if (opt_->count_stalled() && elements16() > 0) {
      const double stalled = epoch_stalled_fraction(t.batches);
      rec["stalled_fraction"] = stalled;
      line << ", " << std::setprecision(1) << 100 * stalled << "% of 16-bit updates stalled";
      // There the weight's value stayed, but the update was not lost.
      if (opt_->update_rounding() == ag::UpdateRounding::Stochastic)
        line << " (kept on average by stochastic rounding)";
      if (opt_->update_rounding() == ag::UpdateRounding::Compensated) line << " (kept in the compensation)";
    }
    if (!o_.quiet) std::printf("%s\n", line.str().c_str());
    log_.push_back(rec);
  }

  void save_checkpoint(int epoch) {
    if (!ckpts_) return;
    epochs_done_ = epoch;
    last_good_ = ckpts_->save(lite_, state_, epoch);
  }

  // gpt: the text's last val_fraction is held out. A training sample at position i reads
  // tokens i to i + block, so training positions end a block before the held-out part.
  int64_t held_out() const { return int64_t(o_.val_fraction * double(w_.text->size())); }
  int64_t train_positions() const {
    const int64_t split = w_.text->size() - held_out();
    return std::max<int64_t>(1, held_out() > 0 ? split - o_.block_size : split);
  }

  // The mean loss over val_batches batches at fixed, evenly spaced held-out positions (the
  // same every epoch and in every run), through the wrapped model: in the training
  // precision, without touching the random generator.
  double validation_loss() {
    ag::NoGradGuard ng;
    model_->eval();
    const int64_t first = w_.text->size() - held_out(), count = o_.val_batches * o_.batch_size;
    const int64_t V = w_.text->vocab_size();
    double total = 0;
    for (int64_t b = 0; b < o_.val_batches; ++b) {
      std::vector<int64_t> idx(size_t(o_.batch_size));
      for (int64_t j = 0; j < o_.batch_size; ++j)
        idx[size_t(j)] = first + (b * o_.batch_size + j) * (held_out() - 1) / std::max<int64_t>(1, count - 1);
      const auto batch = w_.text->get_batch(idx);
      const ag::Tensor logits = model_(lite_.to_device(batch.input));
      total += ag::cross_entropy(logits.view({-1, V}), lite_.to_device(batch.target).view({-1})).item<double>();
    }
    model_->train();
    return total / double(o_.val_batches);
  }

  bool scaled() const { return lite_.precision() == ag::Precision::Mixed16; }

  // 16-true / bf16-true: the stalled updates of the epoch, summed on the device each step
  // (no host sync), one count per parameter.
  void count_stalled() {
    if (!opt_->count_stalled()) return;
    const ag::Tensor& per_param = opt_->stalled_counts(0);
    if (!stalled_sum_.defined()) stalled_sum_ = ag::zeros_like(per_param);
    stalled_sum_.add_(per_param);
  }
  int64_t elements16() const {
    int64_t n = 0;
    for (const ag::Tensor& p : w_.net->parameters()) n += ag::is_reduced_floating(p.dtype()) ? p.numel() : 0;
    return n;
  }
  // The epoch's stalled fraction (a host read), and once a run, past --stalled-warn, a
  // warning naming the parameters that stalled most.
  double epoch_stalled_fraction(int64_t steps) {
    if (!stalled_sum_.defined() || steps == 0) return 0;
    const std::vector<int64_t> counts = stalled_sum_.to_vector<int64_t>();
    stalled_sum_.zero_();
    const auto named = w_.net->named_parameters();
    int64_t total = 0;
    std::vector<std::pair<double, std::string>> worst;
    for (size_t i = 0; i < counts.size() && i < named.size(); ++i) {
      total += counts[i];
      if (ag::is_reduced_floating(named[i].second.dtype()))
        worst.push_back({double(counts[i]) / double(named[i].second.numel() * steps), named[i].first});
    }
    const double fraction = double(total) / double(elements16() * steps);
    // Only nearest and master lose what stalls: stochastic and compensated keep it.
    const ag::UpdateRounding mode = opt_->update_rounding();
    const bool loses = mode == ag::UpdateRounding::Nearest || mode == ag::UpdateRounding::Master;
    if (loses && fraction > o_.stalled_warn && !warned_stalled_ && lite_.is_global_zero()) {
      warned_stalled_ = true;
      std::sort(worst.begin(), worst.end(), std::greater<>());
      std::ostringstream w;
      w << std::fixed << std::setprecision(1) << 100 * fraction << "% of the " << ag::precision_name(lite_.precision())
        << " weights' updates were lost to rounding this epoch (--update-rounding "
        << ag::update_rounding_name(opt_->update_rounding()) << "); most: ";
      for (size_t i = 0; i < worst.size() && i < 3; ++i)
        w << (i ? ", " : "") << worst[i].second << " " << 100 * worst[i].first << "%";
      w << ". --update-rounding stochastic, compensated or master keeps them (docs/precision.md)";
      std::fprintf(stderr, "warning: %s\n", w.str().c_str());
    }
    return fraction;
  }

  // Bytes of weights and optimizer state, for --json.
  nlohmann::json memory_json() const {
    size_t weights = 0, count = 0;
    for (const ag::Tensor& p : w_.net->parameters()) {
      weights += size_t(p.numel()) * ag::itemsize(p.dtype());
      count += size_t(p.numel());
    }
    const size_t state = opt_->state_bytes();
    return {{"parameters", count},
            {"weight_bytes", weights},
            {"optimizer_state_bytes", state},
            {"bytes_per_parameter", count ? double(weights + state) / double(count) : 0.0},
            {"peak_bytes", ag::memory_stats(lite_.device()).peak_bytes_in_use}};
  }
  double mean_rate() const { return total_train_time_ > 0 ? total_samples_ / total_train_time_ : 0; }

  ag::Lite& lite_;
  const Options& o_;
  Workload w_;
  const bool gpt_;
  const int world_;
  ag::optim::AdamW adamw_;
  std::pair<ag::LiteModule<ag::nn::Module>, ag::LiteOptimizer> setup_;
  ag::LiteModule<ag::nn::Module>& model_;
  ag::LiteOptimizer& opt_;
  const int64_t steps_per_epoch_;
  ag::LiteScheduler sched_;
  int64_t epochs_done_ = 0;
  double best_ = 0;
  std::string kind_;
  // What a checkpoint holds; Lite adds the grad scaler and the generator's position, so
  // shuffling and dropout continue as in an uninterrupted run.
  const ag::LiteState state_{{"model", model_},       {"optimizer", opt_}, {"scheduler", sched_},
                             {"epoch", epochs_done_}, {"best", best_},     {"model_kind", kind_}};
  std::optional<ag::CheckpointFolder> ckpts_;
  std::string last_good_;  // the newest checkpoint that a stopped run leaves to resume from
  int start_epoch_ = 0;
  int64_t step_ = 0;        // optimizer steps of the run, skipped ones included
  ag::Tensor stalled_sum_;  // the epoch's stalled updates per parameter, on the device
  bool warned_stalled_ = false;
  nlohmann::json log_ = nlohmann::json::array();
  double total_samples_ = 0, total_train_time_ = 0, total_seconds_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"ampgrad-train: train a model with ampgrad"};
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  apply_preset(app, o);
  o.matmul_precision_given = app.count("--float32-matmul-precision") > 0;
  try {
    configure_process(o);
    const PrecisionOnResume on_resume(o);
    ag::Lite lite(lite_options(o, on_resume.kept()));
    start_run(lite, o, on_resume);
    Workload w = load_workload(lite, o);
    const std::optional<ag::TrialReport> trial = measure_if_asked(lite, o, on_resume, w);
    Training run(lite, o, std::move(w));
    run.refuse_to_overwrite_checkpoints();
    run.resume_if_asked();
    run.train_epochs();
    if (!lite.is_global_zero()) return 0;  // the summary, the sample and the JSON are rank 0's
    run.print_summary();
    run.print_sample();
    run.write_json(on_resume, trial);
    return 0;
  } catch (const ag::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
