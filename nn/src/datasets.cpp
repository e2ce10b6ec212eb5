#include "ampgrad/data/datasets.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ampgrad/autograd.h"
#include "ampgrad/data/idx.h"
#include "ampgrad/factories.h"
#include "ampgrad/ops/elementwise.h"
#include "ampgrad/ops/shape.h"

namespace ampgrad::data {

namespace fs = std::filesystem;

std::shared_ptr<TensorDataset> fashion_mnist(bool train, const std::string& dir) {
  const std::string split = train ? "train" : "t10k";
  const std::string images = dir + "/" + split + "-images-idx3-ubyte.gz";
  const std::string labels = dir + "/" + split + "-labels-idx1-ubyte.gz";
  AG_CHECK(fs::exists(images) && fs::exists(labels), "fashion_mnist", "Fashion-MNIST not found in ", dir,
           " (expected ", split, "-images-idx3-ubyte.gz and ", split,
           "-labels-idx1-ubyte.gz); install Debian's package: apt-get install dataset-fashion-mnist");
  Tensor x = read_idx(images);
  Tensor y = read_idx(labels);
  AG_CHECK(x.dim() == 3 && x.size(1) == 28 && x.size(2) == 28, "fashion_mnist", images,
           ": expected images of shape [N, 28, 28], got ", x.sizes());
  AG_CHECK(y.dim() == 1 && y.size(0) == x.size(0), "fashion_mnist", labels, ": expected ", x.size(0),
           " labels, got shape ", y.sizes());
  const uint8_t* lab = y.data_ptr<uint8_t>();
  for (int64_t i = 0; i < y.numel(); ++i)
    AG_CHECK(lab[i] <= 9, "fashion_mnist", labels, ": label ", int(lab[i]), " at index ", i,
             " is out of range (the 10 classes are 0 to 9)");
  NoGradGuard ng;
  // Mean and std of the training images, as torchvision's usual normalisation.
  constexpr double kMean = 0.2860, kStd = 0.3530;
  Tensor xf = (x.to(kFloat32) * float(1.0 / (255.0 * kStd)) - float(kMean / kStd)).view({x.size(0), 1, 28, 28});
  return std::make_shared<TensorDataset>(xf, y.to(kInt64));
}

CharDataset::CharDataset(const std::string& text, int64_t block_size) : block_(block_size) {
  AG_CHECK(block_size > 0, "CharDataset", "block_size must be positive, got ", block_size);
  AG_CHECK(int64_t(text.size()) > block_size, "CharDataset", "the text has ", text.size(),
           " characters, fewer than block_size + 1 = ", block_size + 1);
  bool seen[256] = {};
  for (unsigned char c : text) seen[c] = true;
  std::fill(std::begin(stoi_), std::end(stoi_), -1);
  for (int c = 0; c < 256; ++c)
    if (seen[c]) {
      stoi_[c] = int(vocab_.size());
      vocab_.push_back(char(c));
    }
  tokens_.reserve(text.size());
  for (unsigned char c : text) tokens_.push_back(stoi_[c]);
}

int64_t CharDataset::size() const { return int64_t(tokens_.size()) - block_; }

Batch CharDataset::get_batch(const std::vector<int64_t>& indices) const {
  const int64_t B = int64_t(indices.size()), T = block_;
  Tensor x = empty({B, T}, kInt64), y = empty({B, T}, kInt64);
  int64_t* px = x.data_ptr<int64_t>();
  int64_t* py = y.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t i = indices[size_t(b)];
    AG_CHECK(i >= 0 && i < size(), "CharDataset", "index ", i, " is out of range for ", size(), " examples");
    std::copy_n(tokens_.begin() + i, T, px + b * T);
    std::copy_n(tokens_.begin() + i + 1, T, py + b * T);
  }
  return {x, y};
}

std::vector<int64_t> CharDataset::encode(const std::string& s) const {
  std::vector<int64_t> out;
  for (unsigned char c : s) {
    AG_CHECK(stoi_[c] >= 0, "CharDataset", "character ", int(c), " is not in the vocabulary");
    out.push_back(stoi_[c]);
  }
  return out;
}

std::string CharDataset::decode(const std::vector<int64_t>& tokens) const {
  std::string s;
  for (int64_t t : tokens) {
    AG_CHECK(t >= 0 && t < vocab_size(), "CharDataset", "token ", t, " is out of range for a vocabulary of ",
             vocab_size());
    s.push_back(vocab_[size_t(t)]);
  }
  return s;
}

std::string read_text(const std::string& path) {
  if (!fs::exists(path)) {
    if (path == kFortunesDir)
      AG_ERROR("read_text", path, " not found; install Debian's package: apt-get install fortunes, or pass a text file");
    AG_ERROR("read_text", path, ": no such file or directory");
  }
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path)) {
      const auto ext = e.path().extension().string();
      if (e.is_regular_file() && ext != ".dat" && ext != ".u8") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    AG_CHECK(in.good(), "read_text", f.string(), ": cannot open");
    std::ostringstream ss;
    ss << in.rdbuf();
    text += ss.str();
  }
  AG_CHECK(!text.empty(), "read_text", path, ": no text found");
  return text;
}

}  // namespace ampgrad::data
