// Host syncs are counted at the one place they happen (ampgrad/sync.h): each way of reading
// values on the host counts exactly one, and computing counts none.
#include "support/testing.h"

#include <sstream>

using namespace ag;

namespace {
// How many host syncs f makes, and what made them.
std::pair<uint64_t, std::vector<std::string>> syncs_of(const std::function<void()>& f) {
  const auto what = agt::host_syncs_of(f);
  return {what.size(), what};
}
}  // namespace

TEST(HostSync, EachHostReadCountsOnce) {
  Tensor t = randn({3, 4});
  Tensor one = sum(t);
  EXPECT_EQ(syncs_of([&] { (void)one.item<double>(); }), (std::pair<uint64_t, std::vector<std::string>>{1, {"item"}}));
  EXPECT_EQ(syncs_of([&] { (void)t.to_vector<float>(); }).second, std::vector<std::string>{"to_vector"});
  EXPECT_EQ(syncs_of([&] { std::ostringstream os; os << t; }).second, std::vector<std::string>{"print"});
  EXPECT_EQ(syncs_of([&] { (void)t.str(); }).first, 1u);
  agt::TempDir dir;
  EXPECT_EQ(syncs_of([&] { nn::save(dir.file("t.safetensors"), {{"t", t}}); }).second, std::vector<std::string>{"save"});
}

TEST(HostSync, ComputingCountsNone) {
  Tensor a = randn({8, 8}).requires_grad_(), b = randn({8, 8});
  const auto [n, what] = syncs_of([&] {
    Tensor y = relu(matmul(a, b) + 1.0).sum();
    y.backward();
    (void)a.grad().to(kBFloat16).to(Device(kCPU));  // a CPU tensor is on the CPU already
  });
  EXPECT_EQ(n, 0u) << (what.empty() ? std::string() : what.front());
}

TEST(MemoryStats, CountsEveryStorage) {
  const MemoryStats a = memory_stats(kCPU);
  {
    Tensor small = zeros({3}), big = zeros({1 << 16});  // a small block and a cached-size one
    const MemoryStats b = memory_stats(kCPU);
    EXPECT_EQ(b.allocations - a.allocations, 2u);
    EXPECT_EQ(b.bytes_in_use - a.bytes_in_use, 3u * 4 + (1u << 16) * 4);
    Tensor view = big.narrow(0, 0, 5);  // a view allocates no storage
    EXPECT_EQ(memory_stats(kCPU).allocations, b.allocations);
  }
  const MemoryStats c = memory_stats(kCPU);
  EXPECT_EQ(c.frees - a.frees, 2u);
  EXPECT_EQ(c.bytes_in_use, a.bytes_in_use);
}
