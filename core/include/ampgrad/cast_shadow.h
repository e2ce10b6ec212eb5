// Cast shadows: under autocast, every forward casts each float32 parameter to 16 bits
// (a pass that reads 4 and writes 2 bytes per parameter), and the next optimizer step
// rewrites the parameter anyway. A shadow is that cast kept with the parameter across steps:
// the optimizer step writes the new value's rounding in its own pass over the parameter
// (OptimizerLists::casts, where the backend's optimizer_writes_casts()), and autocast's next
// cast of the parameter reads the shadow instead of converting again; forwards with no step
// between them (gradient accumulation) share the first one's cast. The values are the
// same bits as a fresh cast (the step rounds as to_dtype does); only the pass is saved.
//
// Validity rides on the storage's version counter: a shadow counts only for the version
// it was cast from or the step left, so any in-place write to the parameter afterwards (an op, load_state_dict,
// raw_data followed by detail::bump_version) makes autocast cast afresh. A shadow buffer is
// rewritten in place only while nothing but the shadow holds it; a cast still referenced
// (a graph kept alive, a tensor the user holds) keeps its values, and the step writes a new
// buffer. Only leaves that autocast cast with grad mode on get a shadow (training), so
// inference under autocast keeps no extra copy. Thread-safe: one mutex guards every
// parameter's shadow fields.
#pragma once

#include "ampgrad/tensor.h"

namespace ampgrad::detail {

/// The valid shadow of leaf t in dtype as a new tensor sharing its memory (no autograd), or
/// undefined when t has none, it is another dtype, or t changed since a step wrote it.
Tensor shadow_cast(const Tensor& t, DType dtype);
/// Keeps `cast`, autocast's fresh cast of t, as t's shadow buffer, valid for t's current
/// version (a forward before the next step reads it). Nothing is kept in no-grad mode.
void keep_cast(const Tensor& t, const Tensor& cast);
/// For an optimizer step about to update t: the buffer its rounding goes to (the kept one
/// when nothing else holds it, else a new one of its dtype), or undefined when t has no
/// shadow. The shadow is invalid from here until shadow_written.
Tensor shadow_buffer(const Tensor& t);
/// After the step wrote t's update and its rounding (and bumped t's version): the shadow
/// is valid for t's current version.
void shadow_written(const Tensor& t);
/// x.to(shadow's dtype) given its values, a shadow_cast of x: shadow itself, recorded for
/// autograd as the cast (the gradient flows back to x converted to x's dtype).
Tensor cast_from_shadow(const Tensor& x, const Tensor& shadow);

}  // namespace ampgrad::detail
