// Datasets and the DataLoader.
//
// A Dataset hands out batches by index list. The DataLoader walks an epoch in batches —
// shuffled from the seeded generator (ag::manual_seed makes the order reproducible),
// optionally dropping a short last batch — and prepares the next batch on a background
// thread while the caller trains on the current one.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <vector>

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
  /// Prepare the next batch on a background thread.
  bool prefetch = true;
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});

  /// Batches in an epoch.
  int64_t num_batches() const;
  int64_t batch_size() const { return options_.batch_size; }
  const Dataset& dataset() const { return *dataset_; }

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
    Iterator(const DataLoader* loader, std::shared_ptr<const std::vector<int64_t>> order, int64_t pos);
    void load();
    Batch fetch(int64_t batch) const;
    const DataLoader* loader_ = nullptr;
    std::shared_ptr<const std::vector<int64_t>> order_;
    int64_t pos_ = 0;
    Batch current_;
    std::shared_future<Batch> next_;
  };

  /// Starts an epoch: draws a new order when shuffling.
  Iterator begin() const;
  Iterator end() const;

 private:
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
};

/// A permutation of [0, n) from the seeded generator (Fisher-Yates on Philox draws).
std::vector<int64_t> random_permutation(int64_t n);

}  // namespace ampgrad::data
