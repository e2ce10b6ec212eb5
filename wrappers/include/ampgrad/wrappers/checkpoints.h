// A folder of numbered Lite checkpoints: keep the newest K, resume from the newest that loads.
//
//   ag::CheckpointFolder ckpts("runs/mlp", {.keep = 3});
//   ckpts.save(lite, state, epoch);                  // runs/mlp/epoch-0007.safetensors, then prunes
//   auto r = ckpts.load_newest(lite, state);         // skips (and reports) what does not load
//
// Files are named <prefix>-<number>.safetensors; the number (zero-padded to 4 digits, more
// when it needs them) orders them, never the modification time. Other files in the folder,
// and Lite::save's temporary files, are neither listed nor touched.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ampgrad/wrappers/lite.h"

namespace ampgrad {

struct CheckpointFolderOptions {
  /// How many of the newest checkpoints save() leaves in the folder (at least 1).
  int keep = 3;
  /// The file names' stem: letters, digits, '_' and '.', not empty.
  std::string prefix = "epoch";
};

class CheckpointFolder {
 public:
  /// The folder need not exist yet (save() creates it); a path that exists and is not a
  /// folder is an error now, not at the first save.
  explicit CheckpointFolder(std::string dir, CheckpointFolderOptions options = {});

  const std::string& dir() const { return dir_; }
  /// The file that checkpoint `number` (>= 0) is written to.
  std::string path_for(int64_t number) const;

  struct Entry {
    int64_t number;
    std::string path;
  };
  /// The checkpoints in the folder, newest (highest number) first; empty when the folder
  /// does not exist.
  std::vector<Entry> list() const;

  /// Writes checkpoint `number` atomically (Lite::save), then deletes the oldest files so
  /// that `keep` remain: a deletion happens only after the new file is on disk. Returns the
  /// new file's path. Under ddp every rank calls it; rank 0 alone writes and deletes.
  std::string save(Lite& lite, const LiteState& state, int64_t number) const;

  struct Skipped {
    std::string path;
    std::string reason;  // the error that loading it raised
  };
  struct Resumed {
    std::string path;              // the checkpoint restored
    int64_t number = -1;
    std::vector<Skipped> skipped;  // newer ones that did not load, newest first
  };
  /// Restores the newest checkpoint that loads (Lite::load, strict), trying them newest
  /// first; `accept`, when given, runs after a file's metadata is read and before it is
  /// loaded, and rejects the file by throwing ag::Error (say, a checkpoint of another
  /// model). Throws ag::Error naming the folder and every file's reason when none loads,
  /// or when the folder holds no checkpoint. A file that fails may have restored some
  /// items before its error; the one that loads restores them all.
  Resumed load_newest(Lite& lite, const LiteState& state,
                      const std::function<void(const std::string& path, const nn::Metadata&)>& accept = {}) const;

 private:
  std::string dir_;
  CheckpointFolderOptions options_;
};

}  // namespace ampgrad
