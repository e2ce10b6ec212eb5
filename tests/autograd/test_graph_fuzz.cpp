// The random-graph gradient fuzzer (graph_fuzz.h) over a fixed range of seeds, in blocks that
// ctest runs side by side; ampgrad_graph_fuzz (graph_fuzz_main.cpp) runs it for as long as
// asked. And checks of the fuzzer itself: every op is drawn, programs reuse values, the text
// form replays exactly, the shrinker finds the smallest failing program.
#include "autograd/graph_fuzz.h"

#include <map>
#include <set>
#include <string>

#include "support/testing.h"

namespace gf = agt::graph_fuzz;

namespace {

constexpr uint64_t kBlocks = 10;
constexpr uint64_t kSeedsPerBlock = 60;

class GraphFuzz : public ::testing::TestWithParam<uint64_t> {};

}  // namespace

// Each program in float64 against finite differences, in float32 against float64 and in
// bfloat16 under autocast against float32. The first failure of a block is shrunk and
// printed as a test to paste; the others are listed by seed.
TEST_P(GraphFuzz, Seeds) {
  gf::CheckOptions opts;
  opts.bfloat16 = gf::bfloat16_available();
  bool shrunk = false;
  for (uint64_t s = GetParam() * kSeedsPerBlock; s < (GetParam() + 1) * kSeedsPerBlock; ++s) {
    const gf::Program p = gf::generate(s);
    const gf::Outcome oc = gf::check(p, opts);
    if (oc.ok) continue;
    if (!shrunk) ADD_FAILURE() << gf::check_and_report(p, opts);
    else ADD_FAILURE() << "graph fuzz: seed " << s << " fails at " << oc.stage << ": " << oc.message;
    shrunk = true;
  }
}

INSTANTIATE_TEST_SUITE_P(Block, GraphFuzz, ::testing::Range<uint64_t>(0, kBlocks));

// The blocks' bfloat16 stage runs where the CPU can autocast to bfloat16, and then compares
// most programs (it leaves out those where bfloat16 would take another branch at a kink or
// give rounding noise).
TEST(GraphFuzzTool, Bfloat16StageCompares) {
  if (!gf::bfloat16_available())
    AGT_SKIP_HARDWARE() << "autocast to bfloat16 is unsupported on this CPU: the graph fuzz blocks leave their bfloat16 check out";
  gf::CheckOptions opts;
  opts.float32 = false;
  int skipped = 0;
  for (uint64_t s = 0; s < kSeedsPerBlock; ++s) {
    const gf::Outcome oc = gf::check(gf::generate(s), opts);
    EXPECT_TRUE(oc.ok) << oc.message;
    skipped += oc.skipped_bfloat16;
  }
  EXPECT_LT(skipped, int(kSeedsPerBlock) / 4);
}

// Over the in-suite seeds the generator draws every op, reuses values 2 to 4 times, and
// mixes leaves that require grad with leaves that do not.
TEST(GraphFuzzTool, DrawsEveryOpAndReusesValues) {
  std::map<std::string, int> count;
  std::set<int> fan_outs;
  int grad_leaves = 0, plain_leaves = 0, min_ops = 1000, max_ops = 0;
  for (uint64_t s = 0; s < kBlocks * kSeedsPerBlock; ++s) {
    const gf::Program p = gf::generate(s);
    std::map<int, int> uses;
    for (const gf::Op& op : p.ops) {
      ++count[op.name];
      for (int id : op.in) ++uses[id];
      if (op.name == "leaf" && op.attr("kind") == "float") (op.i("grad") ? grad_leaves : plain_leaves)++;
    }
    for (const auto& [id, n] : uses) fan_outs.insert(n);
    min_ops = std::min(min_ops, gf::op_count(p));
    max_ops = std::max(max_ops, gf::op_count(p));
  }
  for (const std::string& name : gf::op_names()) EXPECT_GT(count[name], 0) << name << " is never generated";
  for (int n : {2, 3, 4}) EXPECT_TRUE(fan_outs.count(n)) << "no value is used " << n << " times";
  EXPECT_GT(grad_leaves, 0);
  EXPECT_GT(plain_leaves, 0);
  EXPECT_LE(min_ops, 5);
  EXPECT_GE(max_ops, 25);
}

// The text form reads back to the same program, which computes the same bits.
TEST(GraphFuzzTool, TextFormReplaysExactly) {
  for (uint64_t s = 0; s < 40; ++s) {
    const gf::Program p = gf::generate(s);
    const std::string text = gf::to_text(p);
    const gf::Program q = gf::from_text(text);
    ASSERT_EQ(gf::to_text(q), text);
    const auto a = gf::run(p, gf::make_leaves(p, ag::kFloat64));
    const auto b = gf::run(q, gf::make_leaves(q, ag::kFloat64));
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(agt::same_bits(a[i], b[i])) << "seed " << s << ", output " << i;
  }
  EXPECT_THROW(gf::from_text("v0 = no_such_op v1\n"), std::runtime_error);
}

// Shrinking against "the program has an exp" ends at one exp of a leaf, whatever program it
// started from.
TEST(GraphFuzzTool, ShrinksToTheSmallestFailingProgram) {
  int tried = 0;
  for (uint64_t s = 0; s < 200 && tried < 3; ++s) {
    const gf::Program p = gf::generate(s);
    bool has_exp = false;
    for (const gf::Op& op : p.ops) has_exp = has_exp || op.name == "exp";
    if (!has_exp || gf::op_count(p) < 10) continue;
    ++tried;
    const gf::Program q = gf::shrink(p, [](const gf::Program& c) {
      for (const gf::Op& op : c.ops)
        if (op.name == "exp") return true;
      return false;
    });
    EXPECT_EQ(gf::op_count(q), 1) << gf::to_text(q);
    EXPECT_EQ(q.outputs.size(), 1u);
    for (const gf::Op& op : q.ops) EXPECT_TRUE(op.name == "exp" || op.name == "leaf") << op.name;
  }
  EXPECT_EQ(tried, 3);
}
