// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"): a
// counter-based generator. Output block c of key k depends only on (k, c), so any thread
// or device computes element i of a draw without sequential state: results do not depend
// on the thread count or the backend. Shared by all backends (AG_HOST_DEVICE).
#pragma once

#include <cstdint>

#include "ampgrad/host_device.h"

namespace ampgrad::kernels {

struct Philox4x32 {
  uint32_t out[4];

  /// The block of the 128-bit counter (c0, c1, c2, c3) under the 64-bit key (k0, k1), words
  /// in Random123's order (its known-answer vectors list the counter's words, then the key's).
  AG_HOST_DEVICE Philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
    for (int round = 0; round < 10; ++round) {
      const uint64_t p0 = uint64_t(0xD2511F53u) * c0;
      const uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
      const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
      const uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
      c0 = n0;
      c1 = uint32_t(p1);
      c2 = n2;
      c3 = uint32_t(p0);
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
  }
  /// What every draw uses: counter (low, high, 0, 0) of `counter`'s words, key (low, high)
  /// of `seed`'s.
  AG_HOST_DEVICE Philox4x32(uint64_t seed, uint64_t counter)
      : Philox4x32(uint32_t(counter), uint32_t(counter >> 32), 0, 0, uint32_t(seed), uint32_t(seed >> 32)) {}
};

/// Uniform on [0, 1) from 32 random bits (24 bits of mantissa, as float).
AG_HOST_DEVICE inline float uniform01(uint32_t bits) { return float(bits >> 8) * (1.0f / 16777216.0f); }
/// Uniform on [0, 1) from 64 random bits (53 bits, as double).
AG_HOST_DEVICE inline double uniform01(uint32_t hi, uint32_t lo) {
  return double(((uint64_t(hi) << 32) | lo) >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace ampgrad::kernels
