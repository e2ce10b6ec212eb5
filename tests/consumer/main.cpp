// Compiles against the installed (or added) ampgrad and runs one backward pass.
#include <ampgrad/ampgrad.h>

#include <iostream>

int main() {
  ag::Tensor x = ag::from_vector<float>({1, 2, 3}, {3}).requires_grad_();
  ag::Tensor y = x * x;
  y.backward(ag::ones({3}));
  const auto g = x.grad().to_vector<float>();
  if (g != std::vector<float>{2, 4, 6}) {
    std::cerr << "unexpected gradient\n";
    return 1;
  }
  std::cout << "consumer ok\n";
  return 0;
}
