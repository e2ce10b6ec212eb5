#include "ampgrad/wrappers/checkpoints.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "ampgrad/nn/serialize.h"

namespace ampgrad {

namespace fs = std::filesystem;

namespace {
constexpr const char* kOp = "CheckpointFolder";
constexpr const char* kExt = ".safetensors";

}  // namespace

CheckpointFolder::CheckpointFolder(std::string dir, CheckpointFolderOptions options)
    : dir_(std::move(dir)), options_(std::move(options)) {
  AG_CHECK(!dir_.empty(), kOp, "the folder's path is empty");
  AG_CHECK(options_.keep >= 1, kOp, "keep must be at least 1, got ", options_.keep);
  const auto name_char = [](unsigned char c) { return std::isalnum(c) || c == '_' || c == '.'; };
  AG_CHECK(!options_.prefix.empty() && std::all_of(options_.prefix.begin(), options_.prefix.end(), name_char), kOp,
           "the prefix must be letters, digits, '_' or '.', got \"", options_.prefix, "\"");
  std::error_code ec;
  const fs::file_status st = fs::status(dir_, ec);
  AG_CHECK(!fs::exists(st) || fs::is_directory(st), kOp, dir_, " exists and is not a folder");
}

std::string CheckpointFolder::path_for(int64_t number) const {
  AG_CHECK(number >= 0, kOp, "a checkpoint's number must be non-negative, got ", number);
  char digits[32];
  std::snprintf(digits, sizeof digits, "%04lld", static_cast<long long>(number));
  return (fs::path(dir_) / (options_.prefix + "-" + digits + kExt)).string();
}

std::vector<CheckpointFolder::Entry> CheckpointFolder::list() const {
  std::vector<Entry> out;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return out;
  fs::directory_iterator it(dir_, ec), end;
  AG_CHECK(!ec, kOp, dir_, ": cannot list the folder: ", ec.message());
  const std::string stem = options_.prefix + "-", ext = kExt;
  for (; it != end; it.increment(ec)) {
    AG_CHECK(!ec, kOp, dir_, ": cannot list the folder: ", ec.message());
    const std::string name = it->path().filename().string();
    if (name.size() <= stem.size() + ext.size() || name.compare(0, stem.size(), stem) != 0 ||
        name.compare(name.size() - ext.size(), ext.size(), ext) != 0)
      continue;
    const char* first = name.data() + stem.size();
    const char* last = name.data() + name.size() - ext.size();
    if (!std::all_of(first, last, [](char c) { return c >= '0' && c <= '9'; })) continue;
    int64_t number = 0;
    const auto [ptr, err] = std::from_chars(first, last, number);
    if (err != std::errc() || ptr != last) continue;  // too many digits for int64: not ours
    out.push_back({number, it->path().string()});
  }
  // Two names for one number ("epoch-7", "epoch-0007") order by name, so the order is total.
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return a.number != b.number ? a.number > b.number : a.path > b.path;
  });
  return out;
}

std::string CheckpointFolder::save(Lite& lite, const LiteState& state, int64_t number) const {
  const std::string path = path_for(number);
  std::error_code ec;
  // Under ddp rank 0 alone writes (Lite::save) and rotates; the others only wait for it.
  if (lite.is_global_zero()) fs::create_directories(dir_, ec);
  AG_CHECK(!ec, kOp, dir_, ": cannot create the folder: ", ec.message());
  lite.save(path, state);
  if (!lite.is_global_zero()) return path;
  // The file just written always stays (a run resumed from an older checkpoint may save a
  // lower number than files already there); of the others, the newest keep - 1 stay.
  int kept = 1;
  for (const Entry& e : list()) {
    if (e.path == path) continue;
    if (kept < options_.keep) {
      ++kept;
      continue;
    }
    fs::remove(e.path, ec);
    // The new checkpoint is safe on disk; a stale one that cannot go is reported, not fatal.
    if (ec) std::fprintf(stderr, "warning: [%s] cannot delete the old checkpoint %s: %s\n", kOp, e.path.c_str(),
                         ec.message().c_str());
  }
  return path;
}

CheckpointFolder::Resumed CheckpointFolder::load_newest(
    Lite& lite, const LiteState& state,
    const std::function<void(const std::string&, const nn::Metadata&)>& accept) const {
  const std::vector<Entry> entries = list();
  AG_CHECK(!entries.empty(), kOp, dir_, " holds no checkpoint (", options_.prefix, "-<number>", kExt, ")");
  Resumed r;
  for (const Entry& e : entries) {
    try {
      if (accept) accept(e.path, nn::load_metadata(e.path));
      lite.load(e.path, state);
      r.path = e.path;
      r.number = e.number;
      return r;
    } catch (const Error& err) {
      // The reason without the file's name in front, which Skipped::path already holds.
      std::string reason = err.message();
      if (reason.rfind(e.path, 0) == 0) {
        reason.erase(0, e.path.size());
        if (reason.rfind(": ", 0) == 0) reason.erase(0, 2);
        else if (reason.rfind(' ', 0) == 0) reason.erase(0, 1);
      }
      r.skipped.push_back({e.path, reason});
    }
  }
  std::string reasons;
  for (const Skipped& s : r.skipped) reasons += "\n  " + s.path + ": " + s.reason;
  AG_ERROR(kOp, dir_, ": no checkpoint loads:", reasons);
}

}  // namespace ampgrad
