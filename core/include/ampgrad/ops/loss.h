// Losses. Reductions accumulate in float32; the result has the input's dtype.
#pragma once

#include "ampgrad/tensor.h"

namespace ampgrad {

enum class Reduction { None, Mean, Sum };

/// logits [N, C] (or [N, C, d...]) against int64 class indices [N] ([N, d...]).
Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     Reduction reduction = Reduction::Mean, int64_t ignore_index = -100,
                     double label_smoothing = 0.0);
/// log-probabilities [N, C] against int64 class indices [N].
Tensor nll_loss(const Tensor& log_probs, const Tensor& target,
                Reduction reduction = Reduction::Mean, int64_t ignore_index = -100);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        Reduction reduction = Reduction::Mean);

}  // namespace ampgrad
