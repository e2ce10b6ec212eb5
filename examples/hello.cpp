// A first look at ampgrad: a tensor, a backward pass, and the CPU features found.
#include <ampgrad/ampgrad.h>

#include <iostream>

int main() {
  ag::manual_seed(0);
  std::cout << "ampgrad " << AMPGRAD_VERSION_STRING << " (oneDNN " << (ag::built_with_onednn() ? "on" : "off")
            << ", CUDA " << (ag::built_with_cuda() ? "on" : "off") << ")\n\n";

  // A leaf tensor that requires grad, a small graph, and its backward pass.
  ag::Tensor x = ag::from_vector<float>({-1, 0.5, 2, 3, -4, 5}, {2, 3}).requires_grad_();
  ag::Tensor y = ag::relu(x * x - x * 2.0f);  // relu(x^2 - 2x)
  std::cout << "x = " << x << "\n\n";
  std::cout << "y = relu(x^2 - 2x) = " << y << "\n\n";
  y.backward(ag::ones_like(y));
  std::cout << "dy/dx = (2x - 2) where x^2 - 2x > 0 = " << x.grad() << "\n\n";

  // The same computation in bfloat16: stored in 16 bits, computed in float32.
  ag::Tensor xb = x.detach().to(ag::kBFloat16);
  std::cout << "in bfloat16: " << ag::relu(xb * xb - xb * 2.0f) << "\n\n";

  const auto& cpu = ag::hw::cpu_features();
  auto flag = [](const char* name, bool on) { std::cout << "  " << name << (on ? ": yes" : ": no") << "\n"; };
  std::cout << "CPU: " << cpu.model_name << " (" << cpu.vendor << "), " << cpu.logical_cores
            << " logical cores\n";
  flag("avx2", cpu.avx2);
  flag("fma", cpu.fma);
  flag("f16c", cpu.f16c);
  flag("avx512f", cpu.avx512f);
  flag("avx512bw", cpu.avx512bw);
  flag("avx512_bf16", cpu.avx512_bf16);
  flag("avx512_fp16", cpu.avx512_fp16);
  flag("amx_bf16", cpu.amx_bf16);
  std::cout << "  vectorised fp32<->fp16 conversion: " << (ag::vectorized_convert_available(false) ? "F16C" : "portable")
            << "\n  vectorised fp32<->bf16 conversion: " << (ag::vectorized_convert_available(true) ? "AVX512-BF16" : "portable")
            << "\n";
  return 0;
}
