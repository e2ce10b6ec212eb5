// IDX files (the MNIST family's format), plain or gzip-compressed.
//
// An IDX file is a 4-byte magic number (0, 0, element type, number of dims), the dims as
// big-endian uint32, then the elements. read_idx checks the magic number, that the dims
// are sane, and that the data holds exactly the elements the dims promise; any failure is
// an ag::Error naming the file and what is wrong.
#pragma once

#include <string>

#include "ampgrad/tensor.h"

namespace ampgrad::data {

/// Reads an IDX file of unsigned bytes (type 0x08) into a uint8 tensor shaped by its dims.
/// Files ending in ".gz" are decompressed with zlib.
Tensor read_idx(const std::string& path);

/// Writes a uint8 tensor as an IDX file (gzip-compressed when path ends in ".gz"); for tests
/// and for preparing data. Writes to a temporary file and renames it into place.
void write_idx(const std::string& path, const Tensor& t);

}  // namespace ampgrad::data
