// A first look at ampgrad: a tensor, a backward pass, and the CPU features found.
#include <ampgrad/ampgrad.h>

#include <iostream>

int main() {
  ag::manual_seed(0);
  ag::Tensor x = ag::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).requires_grad_();
  ag::Tensor y = (x * x + 2.0f * x).relu();
  std::cout << "x = " << x << "\n";
  std::cout << "y = x * x + 2x = " << y << "\n";
  return 0;
}
