// Ready-made datasets: Fashion-MNIST from Debian's dataset-fashion-mnist package, and a
// character-level text dataset (by default the text of Debian's fortunes package).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ampgrad/data/dataset.h"

namespace ampgrad::data {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

/// Fashion-MNIST: images float32 [N, 1, 28, 28] normalised with the training set's mean
/// and std, labels int64 [N]. A missing directory is an ag::Error that names the Debian
/// package to install.
std::shared_ptr<TensorDataset> fashion_mnist(bool train, const std::string& dir = kFashionMnistDir);

/// Next-character prediction over a text: example i is (tokens[i, i+T), tokens[i+1, i+T+1))
/// as int64 [T] each. Tokens index the sorted set of bytes found in the text.
class CharDataset : public Dataset {
 public:
  CharDataset(const std::string& text, int64_t block_size);
  int64_t size() const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  int64_t vocab_size() const { return int64_t(vocab_.size()); }
  int64_t block_size() const { return block_; }
  std::vector<int64_t> encode(const std::string& s) const;
  std::string decode(const std::vector<int64_t>& tokens) const;

 private:
  std::string vocab_;
  int stoi_[256];
  std::vector<int64_t> tokens_;
  int64_t block_;
};

/// The text of a file, or of every fortune file in a directory (skipping the .dat index
/// files). Throws naming the path (and the fortunes package for the default directory).
std::string read_text(const std::string& path = kFortunesDir);

}  // namespace ampgrad::data
