// Philox4x32-10 (core/include/ampgrad/philox.h), the generator behind every random draw, the shuffle and
// dropout, against its published known answers.
#include "support/testing.h"

#include "ampgrad/philox.h"

using ampgrad::kernels::Philox4x32;

namespace {

using Words = std::vector<uint32_t>;

Words words(const Philox4x32& r) { return {r.out[0], r.out[1], r.out[2], r.out[3]}; }

}  // namespace

// Random123's kat_vectors, the three philox4x32 10 lines: counter (4 words), key (2 words)
// -> output (4 words).
TEST(Philox, Random123KnownAnswers) {
  struct Kat {
    Words ctr, key, want;
  };
  const std::vector<Kat> kats = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats)
    EXPECT_EQ(words(Philox4x32(k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3], k.key[0], k.key[1])), k.want)
        << "counter " << std::hex << k.ctr[0] << " " << k.ctr[1] << " " << k.ctr[2] << " " << k.ctr[3] << " key "
        << k.key[0] << " " << k.key[1];
}

// The (seed, counter) form every draw uses: Random123's philox4x32 10 of counter (low,
// high, 0, 0) and key (low, high). The expected words come from a separate implementation
// of Philox4x32-10 written from Salmon et al.'s definition (it reproduces the three
// vectors above).
TEST(Philox, SeedAndCounterAreTheLowWordsOfKeyAndCounter) {
  EXPECT_EQ(words(Philox4x32(0, 0)), (Words{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(words(Philox4x32(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull)),
            (Words{0xe69c9c31, 0xb5a3d762, 0xe733bfc1, 0x341a787c}));
  EXPECT_EQ(words(Philox4x32(42, 7)), (Words{0x5bbd83b1, 0x68784c85, 0x172067aa, 0x2e6b75b7}));
}
