// Datasets and the DataLoader.
//
// A Dataset hands out batches by index list. The DataLoader walks an epoch in batches —
// shuffled from the seeded generator (ag::manual_seed makes the order reproducible),
// optionally dropping a short last batch — and prepares the next batch on a background
// thread while the caller trains on the current one.
//
// For a device, it can hand out batches in pinned host memory (pin_memory) and move them
// itself (device): the next batch is copied, non-blocking, on a side stream of the loader's
// while the current one computes, an event is recorded after the copy, and when the batch is
// handed out the consumer's current stream waits on that event (the host does not) and
// record_stream marks the batch as used on the consumer's stream, so its memory is not
// reused before the consumer's work on it is done (ampgrad/stream.h).
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <vector>

#include "ampgrad/stream.h"
#include "ampgrad/tensor.h"

namespace ampgrad::data {

struct Batch {
  Tensor input;
  Tensor target;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  /// The examples at `indices`, stacked along a new first dim.
  virtual Batch get_batch(const std::vector<int64_t>& indices) const = 0;
};

/// Rows of two tensors with the same first dim.
class TensorDataset : public Dataset {
 public:
  TensorDataset(Tensor inputs, Tensor targets);
  int64_t size() const override { return inputs_.size(0); }
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor inputs_, targets_;
};

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  bool drop_last = false;
  /// Prepare the next batch on a background thread. Unset (the default): when `device` is
  /// an accelerator (the step runs there and the CPU is free), or when the training step's
  /// OpenMP team leaves a hardware thread free for it (omp_get_max_threads() below
  /// std::thread::hardware_concurrency() when the loader is made); not when a CPU step's
  /// team fills the CPU, because the extra thread then takes its time from the team's
  /// barriers (docs/performance-history.md). Set true for a dataset whose get_batch is
  /// costly (decoding).
  std::optional<bool> prefetch;
  /// Hand out batches in pinned host memory (Tensor::pin_memory), from which copies to a
  /// device do not make the host wait. Without device, the batches stay on the CPU.
  bool pin_memory = false;
  /// Move each batch to this device (non-blocking, on the loader's side stream, ordered
  /// before the consumer's stream by an event). Set to the CPU, where the move is a no-op,
  /// the streams, event and record_stream still run.
  std::optional<Device> device;
  /// One shard of every epoch, for data-parallel training (Lite's "ddp" sets these): the
  /// epoch's order (shuffled or not) is padded by repeating its start to a multiple of
  /// num_shards, and this loader takes every num_shards-th index from `shard` on, so that
  /// the shards are equal and together hold every sample at least once.
  int64_t num_shards = 1;
  int64_t shard = 0;
  /// Shuffle epoch e with a permutation drawn from (shuffle_seed, e) rather than from the
  /// global generator: loaders in different processes then agree on each epoch's order.
  std::optional<uint64_t> shuffle_seed;
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});

  /// Batches in an epoch.
  int64_t num_batches() const;
  int64_t batch_size() const { return options_.batch_size; }
  /// Whether batches are prepared on a background thread (DataLoaderOptions::prefetch,
  /// resolved when the loader was made).
  bool prefetches() const { return prefetch_; }
  const Dataset& dataset() const { return *dataset_; }
  const std::shared_ptr<const Dataset>& dataset_ptr() const { return dataset_; }
  const DataLoaderOptions& options() const { return options_; }
  /// Samples per epoch for this loader's shard (the dataset's size without sharding).
  int64_t shard_size() const;

  class Iterator {
   public:
    Iterator() = default;
    const Batch& operator*() const { return current_; }
    const Batch* operator->() const { return &current_; }
    Iterator& operator++();
    bool operator==(const Iterator& o) const { return pos_ == o.pos_; }
    bool operator!=(const Iterator& o) const { return pos_ != o.pos_; }

   private:
    friend class DataLoader;
    // A batch and, when the loader moves batches, the event recorded after its move.
    struct Prepared {
      Batch batch;
      std::shared_ptr<Event> ready;
    };
    Iterator(const DataLoader* loader, std::shared_ptr<const std::vector<int64_t>> order, int64_t pos);
    void load();
    Prepared fetch(int64_t batch) const;
    void hand_out(const Prepared& p);
    // The epoch's background thread (with prefetch), shared by the iterator's copies.
    class Prefetcher;
    const DataLoader* loader_ = nullptr;
    std::shared_ptr<const std::vector<int64_t>> order_;
    int64_t pos_ = 0;
    Batch current_;
    std::shared_future<Prepared> next_;
    std::shared_ptr<Prefetcher> worker_;
  };

  /// Starts an epoch: draws a new order when shuffling (the next epoch's, with
  /// shuffle_seed).
  Iterator begin() const;
  Iterator end() const;
  /// The stream batches are moved on (with the device option; destroyed with the last copy
  /// of the loader), or nullopt.
  std::optional<Stream> side_stream() const;

 private:
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  bool prefetch_ = false;
  std::shared_ptr<const Stream> side_;  // with options_.device
  mutable uint64_t epoch_ = 0;          // epochs begun (shuffle_seed's second half)
};

/// A permutation of [0, n) from the seeded generator (Fisher-Yates on Philox draws).
std::vector<int64_t> random_permutation(int64_t n);

}  // namespace ampgrad::data
