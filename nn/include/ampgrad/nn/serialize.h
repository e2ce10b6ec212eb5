// Saving and loading named tensors in the safetensors format (an 8-byte little-endian
// header length, a JSON header of dtype/shape/offsets plus string metadata, then the raw
// data), so checkpoints open in Python's safetensors as well.
//
// Saving writes a temporary file in the same directory, flushes it to disk and renames it
// over the target: an interrupted save leaves the previous file intact, never half of one.
#pragma once

#include <map>
#include <string>

#include "ampgrad/nn/module.h"

namespace ampgrad::nn {

using Metadata = std::map<std::string, std::string>;

void save(const std::string& path, const StateDict& tensors, const Metadata& metadata = {});
/// Loads every tensor (on the CPU), the tensors in any order in the file. Throws ag::Error
/// naming the file and the problem for a missing, short or malformed file: a header length
/// past the file or over safetensors' 100 MB limit, a header that is not a JSON object, an
/// unknown dtype, offsets that disagree with dtype and shape or leave the data, tensors that
/// overlap or leave holes, metadata values that are not strings.
StateDict load(const std::string& path, Metadata* metadata = nullptr);
/// The metadata alone, after the same checks of the whole header as load() (the data is
/// not read): a cheap look at what a file holds before loading it.
Metadata load_metadata(const std::string& path);

}  // namespace ampgrad::nn
