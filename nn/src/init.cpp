#include "ampgrad/nn/init.h"

#include <cmath>

#include "ampgrad/autograd.h"

namespace ampgrad::nn::init {

std::pair<int64_t, int64_t> fan_in_and_fan_out(const Tensor& w) {
  AG_CHECK(w.dim() >= 2, "init", "fan in and fan out need a tensor of at least 2 dims, got shape ",
           w.sizes());
  int64_t receptive = 1;
  for (int64_t d = 2; d < w.dim(); ++d) receptive *= w.size(d);
  return {w.size(1) * receptive, w.size(0) * receptive};
}

Tensor uniform_(const Tensor& t, double low, double high) {
  NoGradGuard ng;
  Tensor x = t;
  return x.uniform_(low, high);
}

Tensor normal_(const Tensor& t, double mean, double std) {
  NoGradGuard ng;
  Tensor x = t;
  return x.normal_(mean, std);
}

Tensor constant_(const Tensor& t, double value) {
  NoGradGuard ng;
  Tensor x = t;
  return x.fill_(value);
}

Tensor zeros_(const Tensor& t) { return constant_(t, 0); }
Tensor ones_(const Tensor& t) { return constant_(t, 1); }

Tensor kaiming_uniform_(const Tensor& t, double a) {
  const auto [fan_in, fan_out] = fan_in_and_fan_out(t);
  const double gain = std::sqrt(2.0 / (1 + a * a));
  const double bound = gain * std::sqrt(3.0 / double(fan_in));
  return uniform_(t, -bound, bound);
}

Tensor xavier_uniform_(const Tensor& t, double gain) {
  const auto [fan_in, fan_out] = fan_in_and_fan_out(t);
  const double bound = gain * std::sqrt(6.0 / double(fan_in + fan_out));
  return uniform_(t, -bound, bound);
}

}  // namespace ampgrad::nn::init
