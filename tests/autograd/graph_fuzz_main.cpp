// ampgrad_graph_fuzz: the random-graph gradient fuzzer (graph_fuzz.h) for as long as asked.
//
//   ampgrad_graph_fuzz [--seconds N] [--seed S] [--count C] [--max-failures K] [--no-bfloat16]
//       programs for seeds S, S+1, ... for N seconds (default 60) or C programs (S default:
//       from the clock, printed); each failure is shrunk and printed as a program and as a
//       test; stops after K failures (default 3). Exit status 1 when any failed.
//   ampgrad_graph_fuzz --replay FILE
//       checks the program in FILE (the text form) and reports as above.
//   ampgrad_graph_fuzz --print --seed S [--count N]
//       prints the programs of seeds S to S+N-1 (default 1) as text and as tests.
//   ampgrad_graph_fuzz --dump DIR --seed S --count N
//       writes the programs of seeds S to S+N-1 as DIR/S.prog and, as DIR/S.ref, their
//       float64 outputs and the leaves' gradients (backward from every output k with
//       output_gradient(k)), or the error; for scripts/graph-fuzz-vs-torch.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "autograd/graph_fuzz.h"

namespace gf = agt::graph_fuzz;

namespace {

int usage() {
  std::cerr << "usage: ampgrad_graph_fuzz [--seconds N] [--seed S] [--count C] [--max-failures K] [--no-bfloat16]\n"
               "       ampgrad_graph_fuzz --replay FILE\n"
               "       ampgrad_graph_fuzz --print --seed S [--count N]\n"
               "       ampgrad_graph_fuzz --dump DIR --seed S --count N\n";
  return 2;
}

std::string numbers(const ag::Tensor& t) {
  std::ostringstream os;
  os.precision(17);
  const auto v = t.detach().to(ag::kFloat64).to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  return os.str();
}

std::string shape(const ag::Tensor& t) {
  std::string s;
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? "," : "") + std::to_string(t.size(i));
  return s;
}

// DIR/S.prog and DIR/S.ref (see above).
void dump(const gf::Program& p, const std::filesystem::path& dir) {
  const std::string base = (dir / std::to_string(p.seed)).string();
  std::ofstream(base + ".prog") << gf::to_text(p);
  std::ofstream ref(base + ".ref");
  try {
    const auto leaves = gf::make_leaves(p, ag::kFloat64);
    const auto outs = gf::run(p, leaves);
    ag::TensorList roots, grads;
    for (size_t k = 0; k < outs.size(); ++k) {
      ref << "out " << k << " " << shape(outs[k]) << " " << numbers(outs[k]) << "\n";
      if (outs[k].requires_grad()) {
        roots.push_back(outs[k]);
        grads.push_back(gf::output_gradient(int64_t(k), outs[k].sizes().vec(), ag::kFloat64));
      }
    }
    if (!roots.empty()) ag::run_backward(roots, grads, false);
    size_t li = 0;
    for (const gf::Op& op : p.ops) {
      if (op.name != "leaf") continue;
      const ag::Tensor& l = leaves[li++];
      if (!l.requires_grad()) continue;
      const ag::Tensor g = l.grad().defined() ? l.grad() : ag::zeros(l.sizes().vec(), ag::kFloat64);
      ref << "grad v" << op.out[0] << " " << shape(g) << " " << numbers(g) << "\n";
    }
  } catch (const std::exception& e) {
    std::string msg = e.what();
    for (char& c : msg)
      if (c == '\n') c = ' ';
    ref << "error " << msg << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 60;
  uint64_t seed = uint64_t(std::chrono::system_clock::now().time_since_epoch().count()) % 1000000000;
  int max_failures = 3;
  long count = -1;
  std::string replay, dump_dir;
  bool print = false;
  gf::CheckOptions opts;
  opts.bfloat16 = gf::bfloat16_available();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) std::exit(usage());
      return argv[++i];
    };
    if (a == "--seconds") seconds = std::atof(next().c_str());
    else if (a == "--seed") seed = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--max-failures") max_failures = std::atoi(next().c_str());
    else if (a == "--no-bfloat16") opts.bfloat16 = false;
    else if (a == "--replay") replay = next();
    else if (a == "--dump") dump_dir = next();
    else if (a == "--count") count = std::atol(next().c_str());
    else if (a == "--print") print = true;
    else return usage();
  }
  try {
    if (!replay.empty()) {
      std::ifstream in(replay);
      if (!in) {
        std::cerr << "ampgrad_graph_fuzz: cannot read " << replay << "\n";
        return 2;
      }
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string report = gf::check_and_report(gf::from_text(ss.str()), opts);
      std::cout << (report.empty() ? "passes\n" : report);
      return report.empty() ? 0 : 1;
    }
    if (print) {
      for (long k = 0; k < std::max(count, 1L); ++k) {
        const gf::Program p = gf::generate(seed + uint64_t(k));
        std::cout << gf::to_text(p) << gf::to_cpp(p, "Seed" + std::to_string(p.seed), "float64");
      }
      return 0;
    }
    if (!dump_dir.empty()) {
      if (count < 0) return usage();
      std::filesystem::create_directories(dump_dir);
      for (long k = 0; k < count; ++k) dump(gf::generate(seed + uint64_t(k)), dump_dir);
      return 0;
    }
    std::cout << "ampgrad_graph_fuzz: seeds from " << seed << " for " << seconds << " s"
              << (opts.bfloat16 ? "" : " (no bfloat16 check: autocast to bfloat16 is unsupported on this CPU)") << std::endl;
    const auto start = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    long graphs = 0, ops = 0, skipped32 = 0, skipped16 = 0;
    int failures = 0;
    double next_note = 30;
    for (uint64_t s = seed; elapsed() < seconds && failures < max_failures && (count < 0 || graphs < count); ++s) {
      gf::Outcome oc;
      std::string report;
      try {
        const gf::Program p = gf::generate(s);
        ops += gf::op_count(p);
        report = gf::check_and_report(p, opts, &oc);
      } catch (const std::exception& e) {  // the generator's own error
        report = "graph fuzz: seed " + std::to_string(s) + ": " + e.what() + "\n";
      }
      ++graphs;
      skipped32 += oc.skipped_float32;
      skipped16 += oc.skipped_bfloat16;
      if (!report.empty()) {
        ++failures;
        std::cout << report << std::flush;
      }
      if (elapsed() >= next_note) {
        std::cout << "  " << int(elapsed()) << " s: " << graphs << " graphs, seeds " << seed << " to " << s << std::endl;
        next_note += 30;
      }
    }
    std::cout << "ampgrad_graph_fuzz: " << graphs << " graphs (" << ops << " ops), seeds " << seed << " to "
              << seed + uint64_t(graphs) - 1 << ", " << failures << " failed; comparisons skipped (a kink's other branch, rounding noise): "
              << skipped32 << " float32, " << skipped16 << " bfloat16" << std::endl;
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::cerr << "ampgrad_graph_fuzz: " << e.what() << "\n";
    return 1;
  }
}
