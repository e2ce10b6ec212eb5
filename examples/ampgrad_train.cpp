// ampgrad-train: trains an MLP, a CNN (Fashion-MNIST) or a small char-level GPT and reports
// what a person wants to see: the hardware, the precision, a progress bar per epoch,
// per-epoch loss and accuracy, and a closing summary.
#include <ampgrad/ampgrad.h>
#include <omp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

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
  std::string precision;  // empty: AMPGRAD_PRECISION if set, else "auto"
  std::string accelerator = "auto";
  std::string output_conversion = "to-default";
  std::string schedule = "cosine";
  bool quiet = false;
  // gpt
  int64_t layers = 2, heads = 4, width = 128, block_size = 64, steps_per_epoch = 200, sample_len = 200;
};

// One line per epoch, redrawn in place on a terminal, printed once at the end otherwise.
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
template <class M>
double accuracy(ag::LiteModule<M>& model, ag::Lite& lite, const ag::data::TensorDataset& test) {
  ag::NoGradGuard ng;
  model->eval();
  ag::data::DataLoader loader(std::shared_ptr<const ag::data::Dataset>(&test, [](const ag::data::Dataset*) {}),
                              {.batch_size = 1000});
  int64_t correct = 0;
  for (const auto& b : lite.setup_dataloader(loader)) {
    ag::Tensor pred = ag::argmax(model(b.input), 1);
    correct += ag::sum(ag::eq(pred, b.target)).item<int64_t>();
  }
  model->train();
  return double(correct) / double(test.size());
}

void print_hardware(const ag::Lite& lite) {
  std::printf("threads  : %d\n%s\n", omp_get_max_threads(), lite.describe().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"ampgrad-train: train a model with ampgrad"};
  app.add_option("--model", o.model, "mlp, cnn (Fashion-MNIST) or gpt (char-level text)")
      ->check(CLI::IsMember({"mlp", "cnn", "gpt"}));
  app.add_option("--epochs", o.epochs, "epochs to train")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", o.batch_size, "samples per batch")->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "AdamW learning rate")->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "seed for initialisation, shuffling and dropout");
  app.add_option("--threads", o.threads, "CPU threads (default: all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--data", o.data, "dataset directory (mlp, cnn) or text file (gpt)");
  app.add_option("--save", o.save, "write a checkpoint here after each epoch");
  app.add_option("--resume", o.resume, "continue from this checkpoint");
  app.add_option("--precision", o.precision,
                 "auto (default; AMPGRAD_PRECISION when set), 32-true, 64-true, 16-mixed, bf16-mixed, 16-true, "
                 "bf16-true");
  app.add_option("--accelerator", o.accelerator, "auto (default), cpu, cuda, cuda:N");
  app.add_option("--output-conversion", o.output_conversion,
                 "dtype of the model's floating outputs: to-default (float32), to-input-dtype or none");
  app.add_option("--schedule", o.schedule, "learning rate over the run: cosine (decays to 0 by the last step) or constant")
      ->check(CLI::IsMember({"cosine", "constant"}));
  app.add_flag("--quiet", o.quiet, "print only the summary");
  app.add_option("--json", o.json, "write per-epoch figures to this file");
  app.add_option("--layers", o.layers, "gpt: transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--heads", o.heads, "gpt: attention heads")->check(CLI::PositiveNumber);
  app.add_option("--width", o.width, "gpt: embedding width")->check(CLI::PositiveNumber);
  app.add_option("--block-size", o.block_size, "gpt: context length")->check(CLI::PositiveNumber);
  app.add_option("--steps-per-epoch", o.steps_per_epoch, "gpt: batches per epoch")->check(CLI::PositiveNumber);
  app.add_option("--sample-length", o.sample_len, "gpt: characters generated after training");
  CLI11_PARSE(app, argc, argv);

  try {
    if (o.threads > 0) omp_set_num_threads(o.threads);
    if (o.precision.empty()) {
      const char* env = std::getenv("AMPGRAD_PRECISION");
      o.precision = env && *env ? env : "auto";
    }
    ag::Lite lite({.accelerator = o.accelerator,
                   .precision = o.precision,
                   .output_conversion = ag::parse_output_conversion(o.output_conversion)});
    lite.seed_everything(o.seed);
    const bool gpt = o.model == "gpt";
    if (!o.quiet) print_hardware(lite);

    // ---- data and model ----
    std::shared_ptr<ag::data::TensorDataset> train, test;
    std::shared_ptr<ag::data::CharDataset> text;
    std::shared_ptr<ag::nn::Module> net;
    std::shared_ptr<ag::nn::GPT> gpt_model;
    auto init = lite.init_module();  // parameters built in the precision's dtype, until reset
    if (gpt) {
      text = std::make_shared<ag::data::CharDataset>(ag::data::read_text(o.data.empty() ? ag::data::kFortunesDir : o.data),
                                                     o.block_size);
      gpt_model = std::make_shared<ag::nn::GPT>(ag::nn::GPTConfig{.vocab_size = text->vocab_size(),
                                                                  .block_size = o.block_size,
                                                                  .layers = o.layers,
                                                                  .heads = o.heads,
                                                                  .width = o.width});
      net = gpt_model;
      if (!o.quiet)
        std::printf("data     : %lld characters, vocabulary %lld\n", (long long)(text->size() + o.block_size),
                    (long long)text->vocab_size());
    } else {
      const std::string dir = o.data.empty() ? ag::data::kFashionMnistDir : o.data;
      train = ag::data::fashion_mnist(true, dir);
      test = ag::data::fashion_mnist(false, dir);
      net = o.model == "mlp" ? std::shared_ptr<ag::nn::Module>(ag::nn::make_mlp()) : ag::nn::make_cnn();
      if (!o.quiet)
        std::printf("data     : Fashion-MNIST, %lld train / %lld test images\n", (long long)train->size(),
                    (long long)test->size());
    }
    init.reset();
    if (!o.quiet)
      std::printf("model    : %s, %s parameters; AdamW lr %g (%s), batch %lld, seed %llu\n\n", o.model.c_str(),
                  fmt_count(double(net->num_parameters())).c_str(), o.lr, o.schedule.c_str(), (long long)o.batch_size,
                  (unsigned long long)o.seed);
    ag::optim::AdamW adamw(net->parameters(), {.lr = o.lr});
    auto [model, opt] = lite.setup(net, adamw);
    const int64_t steps_per_epoch =
        gpt ? o.steps_per_epoch : (train->size() + o.batch_size - 1) / o.batch_size;
    // The schedule follows the optimizer's real steps (a step skipped for an overflow
    // does not advance it) and is checkpointed, so a resumed run continues the curve.
    ag::LiteScheduler sched = lite.setup_scheduler(
        opt, o.schedule == "cosine" ? ag::optim::CosineAnnealing({.t_max = std::max<int64_t>(1, steps_per_epoch * o.epochs)})
                                    : ag::optim::StepDecay({.step_size = 1, .gamma = 1.0}));

    int64_t epochs_done = 0;
    double best = 0;
    std::string kind = o.model;
    // What a checkpoint holds; Lite adds the grad scaler and the generator's position, so
    // shuffling and dropout continue as in an uninterrupted run.
    const ag::LiteState state{{"model", model}, {"optimizer", opt},  {"scheduler", sched},
                              {"epoch", epochs_done}, {"best", best}, {"model_kind", kind}};
    if (!o.resume.empty()) {
      ag::nn::Metadata meta;
      ag::nn::load(o.resume, &meta);
      AG_CHECK(meta.count("model_kind") && meta["model_kind"] == o.model, "ampgrad-train", o.resume, " holds a ",
               meta.count("model_kind") ? meta["model_kind"] : std::string("?"), " checkpoint, not ", o.model);
      lite.load(o.resume, state);
      if (!o.quiet) std::printf("resumed  : %s after epoch %lld\n\n", o.resume.c_str(), (long long)epochs_done);
    }
    const int start_epoch = int(epochs_done);

    // ---- training ----
    nlohmann::json log = nlohmann::json::array();
    const auto t_all = Clock::now();
    double total_samples = 0, total_train_time = 0;
    for (int epoch = start_epoch + 1; epoch <= o.epochs; ++epoch) {
      model->train();
      const auto t0 = Clock::now();
      double loss_sum = 0;
      int64_t batches = 0, samples = 0;
      // One optimisation step on a batch's loss; both loops below share it.
      auto train_on = [&](const ag::Tensor& loss, int64_t batch_samples) {
        opt.zero_grad();
        lite.backward(loss);
        opt.step();
        sched.step();
        loss_sum += loss.item<double>();
        ++batches;
        samples += batch_samples;
      };
      if (gpt) {
        Progress bar(epoch, o.epochs, o.steps_per_epoch, !o.quiet, "tokens");
        for (int64_t step = 0; step < o.steps_per_epoch; ++step) {
          auto idx = ag::randint(0, text->size(), {o.batch_size}).to_vector<int64_t>();
          auto b = text->get_batch(idx);
          ag::Tensor logits = model(lite.to_device(b.input));
          const int64_t V = text->vocab_size();
          train_on(ag::cross_entropy(logits.view({-1, V}), lite.to_device(b.target).view({-1})),
                   o.batch_size * o.block_size);
          bar.update(step + 1, samples, loss_sum / double(batches));
        }
        bar.update(o.steps_per_epoch, samples, loss_sum / double(batches), true);
      } else {
        auto loader = lite.setup_dataloader(ag::data::DataLoader(train, {.batch_size = o.batch_size, .shuffle = true}));
        Progress bar(epoch, o.epochs, loader.num_batches(), !o.quiet, "samples");
        for (const auto& b : loader) {
          train_on(ag::cross_entropy(model(b.input), b.target), b.input.size(0));
          bar.update(batches, samples, loss_sum / double(batches));
        }
        bar.update(loader.num_batches(), samples, loss_sum / double(batches), true);
      }
      const double train_time = seconds_since(t0);
      total_samples += double(samples);
      total_train_time += train_time;
      nlohmann::json rec = {{"epoch", epoch},
                            {"train_loss", loss_sum / double(batches)},
                            {"seconds", train_time},
                            {gpt ? "tokens_per_s" : "samples_per_s", double(samples) / train_time}};
      if (!gpt) {
        const double acc = accuracy(model, lite, *test);
        best = std::max(best, acc);
        rec["test_accuracy"] = acc;
        if (!o.quiet)
          std::printf("epoch %d: train loss %.4f, test accuracy %.2f%%\n", epoch, loss_sum / double(batches),
                      100 * acc);
      } else if (!o.quiet) {
        std::printf("epoch %d: train loss %.4f\n", epoch, loss_sum / double(batches));
      }
      log.push_back(rec);
      if (!o.save.empty()) {
        epochs_done = epoch;
        lite.save(o.save, state);
      }
    }

    // ---- summary ----
    const double total = seconds_since(t_all);
    const double rate = total_train_time > 0 ? total_samples / total_train_time : 0;
    std::printf("\nsummary: %s, %d epochs in %s, mean %s %s/s", o.model.c_str(), o.epochs - start_epoch,
                fmt_time(total).c_str(), fmt_count(rate).c_str(), gpt ? "tokens" : "samples");
    if (!gpt) std::printf(", best test accuracy %.2f%%", 100 * best);
    std::printf(" (precision %s", ag::precision_name(lite.precision()));
    if (lite.skipped_steps()) std::printf(", %lld steps skipped for overflow", (long long)lite.skipped_steps());
    std::printf(")\n");
    if (gpt) {
      auto prompt = text->encode("\n");
      auto out = gpt_model->generate(prompt, o.sample_len, 0.8, o.seed);
      std::printf("\nsample:\n%s\n", text->decode(out).c_str());
    }
    if (!o.json.empty()) {
      std::ofstream f(o.json);
      f << nlohmann::json{{"model", o.model},
                          {"precision", ag::precision_name(lite.precision())},
                          {"precision_reason", lite.precision_reason()},
                          {"skipped_steps", lite.skipped_steps()},
                          {"epochs", log},
                          {"best_test_accuracy", best}, {"mean_rate", rate}}
               .dump(2)
        << "\n";
      AG_CHECK(f.good(), "ampgrad-train", "cannot write ", o.json);
    }
    return 0;
  } catch (const ag::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
