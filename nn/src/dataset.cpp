#include "ampgrad/data/dataset.h"

#include <omp.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "ampgrad/autograd.h"
#include "ampgrad/factories.h"
#include "ampgrad/ops/shape.h"
#include "ampgrad/stream.h"
#include "ampgrad/philox.h"

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

namespace {
// Fisher-Yates from Philox counters (seed, offset + i).
std::vector<int64_t> permutation_from(int64_t n, uint64_t seed, uint64_t offset) {
  std::vector<int64_t> p(size_t(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    const kernels::Philox4x32 r(seed, offset + uint64_t(i));
    const uint64_t bits = (uint64_t(r.out[0]) << 32) | r.out[1];
    std::swap(p[size_t(i)], p[size_t(bits % uint64_t(i + 1))]);
  }
  return p;
}
}  // namespace

std::vector<int64_t> random_permutation(int64_t n) {
  if (n < 2) return permutation_from(n, 0, 0);
  const auto [seed, offset] = generator_advance(uint64_t(n));
  return permutation_from(n, seed, offset);
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  AG_CHECK(dataset_ != nullptr, "DataLoader", "dataset is null");
  AG_CHECK(options_.batch_size > 0, "DataLoader", "batch_size must be positive, got ", options_.batch_size);
  AG_CHECK(options_.num_shards >= 1 && options_.shard >= 0 && options_.shard < options_.num_shards, "DataLoader",
           "shard must be in [0, num_shards) with num_shards >= 1, got shard ", options_.shard, " of ",
           options_.num_shards);
  prefetch_ = options_.prefetch.value_or((options_.device && !options_.device->is_cpu()) ||
                                         unsigned(omp_get_max_threads()) < std::thread::hardware_concurrency());
  if (options_.device) {
    side_ = std::shared_ptr<const Stream>(new Stream(create_stream(*options_.device)), [](const Stream* s) {
      try {
        destroy_stream(*s);
      } catch (...) {  // a failing device: the stream goes with it
      }
      delete s;
    });
  }
}

std::optional<Stream> DataLoader::side_stream() const {
  return side_ ? std::optional<Stream>(*side_) : std::nullopt;
}

int64_t DataLoader::shard_size() const {
  const int64_t n = dataset_->size(), s = options_.num_shards;
  return (n + s - 1) / s;
}

int64_t DataLoader::num_batches() const {
  const int64_t n = shard_size(), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

DataLoader::Iterator DataLoader::begin() const {
  const int64_t n = dataset_->size();
  const uint64_t epoch = epoch_++;
  std::vector<int64_t> order;
  if (options_.shuffle && options_.shuffle_seed) {
    order = permutation_from(n, *options_.shuffle_seed, epoch << 40);  // 2^40 counters per epoch
  } else if (options_.shuffle) {
    order = random_permutation(n);
  } else {
    order.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) order[size_t(i)] = i;
  }
  if (options_.num_shards > 1 && n > 0) {
    const int64_t S = options_.num_shards, per = shard_size();
    std::vector<int64_t> mine(static_cast<size_t>(per));
    for (int64_t i = 0; i < per; ++i) mine[size_t(i)] = order[size_t((i * S + options_.shard) % n)];  // padded by wrapping
    order = std::move(mine);
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
    hand_out(fetch(pos_));
    load();
  }
}

// One thread for an epoch's batches, started by its first prefetch and joined with the last
// copy of the iterator: a thread started for each batch (std::async) costs the consumer a
// thread's start and join every batch. Batches are fetched in the order asked; an
// exception in one reaches whoever waits for that batch.
class DataLoader::Iterator::Prefetcher {
 public:
  Prefetcher() : thread_([this] { run(); }) {}
  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;  // batches not begun are dropped: nobody is left to wait for them
    }
    cv_.notify_one();
    thread_.join();
  }
  template <class Fetch>
  std::shared_future<Prepared> submit(Fetch&& fetch) {
    std::packaged_task<Prepared()> task(std::forward<Fetch>(fetch));
    std::shared_future<Prepared> done = task.get_future().share();
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
    return done;
  }

 private:
  void run() {
    // One thread: an OpenMP team of its own would compete with the training step's team
    // for the cores.
    omp_set_num_threads(1);
    for (;;) {
      std::packaged_task<Prepared()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
        if (stop_) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<Prepared()>> tasks_;
  bool stop_ = false;
  std::thread thread_;  // last: it starts once the members it uses exist
};

// Runs on the prefetch thread (or the caller's, without prefetch).
DataLoader::Iterator::Prepared DataLoader::Iterator::fetch(int64_t batch) const {
  const DataLoaderOptions& opt = loader_->options_;
  const int64_t b = opt.batch_size;
  const int64_t start = batch * b;
  const int64_t stop = std::min<int64_t>(start + b, int64_t(order_->size()));
  std::vector<int64_t> idx(order_->begin() + start, order_->begin() + stop);
  // With a device, everything for this batch (a dataset that lives on the device too) is
  // queued on the side stream, so that it overlaps the consumer's work on its own stream.
  std::optional<StreamGuard> on_side;
  if (opt.device) on_side.emplace(*loader_->side_);
  Batch out = loader_->dataset_->get_batch(idx);
  if (opt.pin_memory) out = {out.input.pin_memory(), out.target.pin_memory()};
  if (!opt.device) return {std::move(out), nullptr};
  out = {out.input.to(*opt.device, true), out.target.to(*opt.device, true)};
  auto ready = std::make_shared<Event>(*opt.device, false);
  ready->record();
  return {std::move(out), std::move(ready)};
}

// Runs on the consumer's thread: its current stream is the one that will use the batch.
void DataLoader::Iterator::hand_out(const Prepared& p) {
  if (p.ready) {
    const Stream consumer = current_stream(p.ready->device());
    p.ready->wait(consumer);
    record_stream(p.batch.input, consumer);
    record_stream(p.batch.target, consumer);
  }
  current_ = p.batch;
}

// Starts preparing the batch after the current one.
void DataLoader::Iterator::load() {
  const int64_t next = pos_ + 1;
  if (next >= loader_->num_batches()) {
    next_ = {};
    return;
  }
  if (loader_->prefetch_) {
    if (!worker_) worker_ = std::make_shared<Prefetcher>();
    next_ = worker_->submit([loader = loader_, order = order_, next] {
      Iterator tmp;
      tmp.loader_ = loader;
      tmp.order_ = order;
      return tmp.fetch(next);
    });
  } else {
    next_ = {};
  }
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  ++pos_;
  if (pos_ >= loader_->num_batches()) {
    current_ = {};
    worker_.reset();  // the epoch's thread ends with it (unless a copy of the iterator holds it)
    return *this;
  }
  hand_out(next_.valid() ? next_.get() : fetch(pos_));
  load();
  return *this;
}

}  // namespace ampgrad::data
