// Parameter initialisers, drawing from the seeded generator; each fills in place (without
// recording autograd) and returns its argument.
#pragma once

#include "ampgrad/tensor.h"

namespace ampgrad::nn::init {

/// (fan_in, fan_out) of a weight: dims 1 and 0 times the receptive field (dims 2...).
std::pair<int64_t, int64_t> fan_in_and_fan_out(const Tensor& w);
Tensor uniform_(const Tensor& t, double low, double high);
Tensor normal_(const Tensor& t, double mean = 0, double std = 1);
Tensor constant_(const Tensor& t, double value);
Tensor zeros_(const Tensor& t);
Tensor ones_(const Tensor& t);
/// He uniform for a leaky ReLU of negative slope a: bound = sqrt(6 / ((1 + a^2) fan_in)).
Tensor kaiming_uniform_(const Tensor& t, double a = 0);
Tensor xavier_uniform_(const Tensor& t, double gain = 1);

}  // namespace ampgrad::nn::init
