// Loading a safetensors file whose header lists many small tensors: the header's size,
// not the data, sets the time. safetensors caps the header at 100 MB; a file near that
// cap lists about a million tensors.
//
// safetensors_header/<n>/ampgrad: nn::load of a file with n float32 tensors of 2 elements
// (every check: syntax, nesting, duplicate names, offsets that tile the data, then the
// tensors made and read). safetensors_header/<n>/json_parse: nlohmann::json::parse of the
// same header text, already in memory: the floor for a loader built on that parser.
// Target: ratio ours/floor under 5, and seconds at most near the cap.
#include <benchmark/benchmark.h>

#include <ampgrad/ampgrad.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace {

struct HeaderFile {
  std::string path;
  std::string header;  // the JSON text
};

// One file per size, written once per process.
const HeaderFile& file_of(int64_t n) {
  static std::map<int64_t, HeaderFile> files;
  auto it = files.find(n);
  if (it != files.end()) return it->second;
  const std::string path =
      (std::filesystem::temp_directory_path() / ("ampgrad-bench-header-" + std::to_string(n) + ".safetensors")).string();
  ag::nn::StateDict d;
  for (int64_t i = 0; i < n; ++i) d["layer." + std::to_string(i) + ".w"] = ag::full({2}, double(i));
  ag::nn::save(path, d);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= uint64_t(static_cast<unsigned char>(bytes[size_t(i)])) << (8 * i);
  return files[n] = {path, bytes.substr(8, len)};
}

// The size is a template parameter, not an Arg, so that the names stay <case>/<impl>.
template <int64_t N>
void BM_load(benchmark::State& state) {
  const HeaderFile& f = file_of(N);
  for (auto _ : state) benchmark::DoNotOptimize(ag::nn::load(f.path));
  state.counters["header_MB"] = double(f.header.size()) / 1e6;
}

template <int64_t N>
void BM_json_parse(benchmark::State& state) {
  const HeaderFile& f = file_of(N);
  for (auto _ : state) benchmark::DoNotOptimize(nlohmann::json::parse(f.header));
  state.counters["header_MB"] = double(f.header.size()) / 1e6;
}

}  // namespace

BENCHMARK_TEMPLATE(BM_load, 50000)->Name("safetensors_header/50000/ampgrad")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_TEMPLATE(BM_json_parse, 50000)
    ->Name("safetensors_header/50000/json_parse")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_TEMPLATE(BM_load, 1000000)
    ->Name("safetensors_header/1000000/ampgrad")
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)
    ->UseRealTime();
BENCHMARK_TEMPLATE(BM_json_parse, 1000000)
    ->Name("safetensors_header/1000000/json_parse")
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)
    ->UseRealTime();

BENCHMARK_MAIN();
