// sampling/rng.h: the per-request random source. mt19937_64's output sequence is fixed by the C++
// standard, and the conversion to [0, 1) is done by hand (std::uniform_real_distribution is not
// specified bit-exactly), so a seed gives the same tokens on every platform and compiler.
#pragma once

#include <cstdint>
#include <random>

namespace ember {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

 private:
  std::mt19937_64 engine_;
};

}  // namespace ember
