// What stream.cpp and memory.cpp share; not installed.
#pragma once

#include "ampgrad/stream.h"

namespace ampgrad::detail {

/// Devices per type that have streams (and memory counters of their own).
inline constexpr int kMaxDeviceIndex = 16;

/// Throws naming `op` unless d's index has streams.
void check_device_index(Device d, const char* op);
/// Throws naming `op` unless s is a default stream or a created, not destroyed one.
void check_stream(Stream s, const char* op);
/// s, or its device's default stream when s was destroyed (the default stream waited for
/// its work). Never throws.
Stream live_stream(Stream s) noexcept;

/// Releases held blocks of the device whose events have all completed. Never throws.
void process_pending_frees(Device d) noexcept;

}  // namespace ampgrad::detail
