#include "ampgrad/data/dataset.h"

#include <omp.h>

#include "ampgrad/autograd.h"
#include "ampgrad/factories.h"
#include "ampgrad/ops/shape.h"
#include "philox.h"

namespace ampgrad::data {

TensorDataset::TensorDataset(Tensor inputs, Tensor targets)
    : inputs_(inputs.detach()), targets_(targets.detach()) {
  AG_CHECK(inputs_.dim() >= 1 && targets_.dim() >= 1 && inputs_.size(0) == targets_.size(0), "TensorDataset",
           "inputs ", inputs_.sizes(), " and targets ", targets_.sizes(), " must share their first dim");
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  NoGradGuard ng;
  Tensor idx = from_vector<int64_t>(indices, {int64_t(indices.size())});
  return {index_select(inputs_, 0, idx), index_select(targets_, 0, idx)};
}

std::vector<int64_t> random_permutation(int64_t n) {
  std::vector<int64_t> p(size_t(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = i;
  if (n < 2) return p;
  const auto [seed, offset] = generator_advance(uint64_t(n));
  for (int64_t i = n - 1; i > 0; --i) {
    const kernels::Philox4x32 r(seed, offset + uint64_t(i));
    const uint64_t bits = (uint64_t(r.out[0]) << 32) | r.out[1];
    std::swap(p[size_t(i)], p[size_t(bits % uint64_t(i + 1))]);
  }
  return p;
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  AG_CHECK(dataset_ != nullptr, "DataLoader", "dataset is null");
  AG_CHECK(options_.batch_size > 0, "DataLoader", "batch_size must be positive, got ", options_.batch_size);
}

int64_t DataLoader::num_batches() const {
  const int64_t n = dataset_->size(), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

DataLoader::Iterator DataLoader::begin() const {
  const int64_t n = dataset_->size();
  std::vector<int64_t> order;
  if (options_.shuffle) {
    order = random_permutation(n);
  } else {
    order.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) order[size_t(i)] = i;
  }
  return Iterator(this, std::make_shared<const std::vector<int64_t>>(std::move(order)), 0);
}

DataLoader::Iterator DataLoader::end() const {
  Iterator it;
  it.pos_ = num_batches();
  return it;
}

DataLoader::Iterator::Iterator(const DataLoader* loader, std::shared_ptr<const std::vector<int64_t>> order,
                               int64_t pos)
    : loader_(loader), order_(std::move(order)), pos_(pos) {
  if (pos_ < loader_->num_batches()) {
    current_ = fetch(pos_);
    load();
  }
}

Batch DataLoader::Iterator::fetch(int64_t batch) const {
  const int64_t b = loader_->options_.batch_size;
  const int64_t start = batch * b;
  const int64_t stop = std::min<int64_t>(start + b, int64_t(order_->size()));
  std::vector<int64_t> idx(order_->begin() + start, order_->begin() + stop);
  return loader_->dataset_->get_batch(idx);
}

// Starts preparing the batch after the current one.
void DataLoader::Iterator::load() {
  const int64_t next = pos_ + 1;
  if (next >= loader_->num_batches()) {
    next_ = {};
    return;
  }
  if (loader_->options_.prefetch) {
    next_ = std::async(std::launch::async, [loader = loader_, order = order_, next] {
              // One thread: an OpenMP team for this short-lived thread would be created for
              // every batch and compete with the training step's team for the cores.
              omp_set_num_threads(1);
              Iterator tmp;
              tmp.loader_ = loader;
              tmp.order_ = order;
              return tmp.fetch(next);
            }).share();
  } else {
    next_ = {};
  }
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  ++pos_;
  if (pos_ >= loader_->num_batches()) {
    current_ = {};
    return *this;
  }
  current_ = next_.valid() ? next_.get() : fetch(pos_);
  load();
  return *this;
}

}  // namespace ampgrad::data
