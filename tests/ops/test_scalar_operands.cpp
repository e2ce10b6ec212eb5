// Scalar operands reach the kernels by value: t * 2.0 allocates its output and nothing else,
// gives exactly the bits of the tensor-tensor path, keeps PyTorch's promotion (a C++ scalar
// does not widen a tensor of its own category), and its gradient holds the scalar by value.
// A 0-dim CPU tensor next to a tensor of another device acts as a scalar.
#include "support/testing.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

using namespace ag;

namespace {

// Storage allocations on the CPU made by f.
uint64_t allocations_of(const std::function<void()>& f) {
  const uint64_t before = memory_stats(kCPU).allocations;
  f();
  return memory_stats(kCPU).allocations - before;
}

// The bytes of t in row-major order (NaN payloads and signed zeros included).
std::vector<unsigned char> bytes_of(const Tensor& t) {
  NoGradGuard no_grad;
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.raw_data());
  return std::vector<unsigned char>(p, p + c.nbytes());
}

// Values of every dtype, with the awkward ones: NaN, infinities, -0, values that round.
Tensor sample(DType dt) {
  if (dt == kBool) return from_vector<float>({0, 1, 1, 0, 1, 0}, {2, 3}).to(kBool);
  if (dt == kUInt8) return from_vector<float>({0, 1, 7, 100, 250, 3}, {2, 3}).to(kUInt8);
  if (!is_floating(dt)) return from_vector<float>({-5, 0, 3, 7, -1, 100}, {2, 3}).to(dt);
  const float inf = std::numeric_limits<float>::infinity();
  return from_vector<float>({-2.75f, 0.1f, std::nanf(""), inf, -0.0f, 1e4f}, {2, 3}).to(dt);
}

const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> d = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt64, kInt32, kUInt8, kBool};
  return d;
}

// One scalar of each kind; integers non-negative so that uint8 holds them exactly.
const std::vector<Scalar>& scalars() {
  static const std::vector<Scalar> s = {Scalar(true), Scalar(3), Scalar(0), Scalar(-2.5), Scalar(0.1)};
  return s;
}

std::string describe(DType dt, Scalar s) {
  std::ostringstream os;
  os << dtype_name(dt) << " with " << (s.kind == Scalar::Kind::Bool ? "bool " : s.kind == Scalar::Kind::Integral ? "int " : "float ")
     << s.to_double();
  return os.str();
}

// The scalar as the tensor-tensor path sees it: a 0-dim tensor of the dtype promotion picks.
Tensor as_tensor(const Tensor& t, Scalar s) { return scalar_tensor(s, TensorOptions(result_type(t.dtype(), s))); }

struct ScalarOp {
  const char* name;
  std::function<Tensor(const Tensor&, Scalar)> by_value;
  std::function<Tensor(const Tensor&, const Tensor&)> by_tensor;  // the same op, scalar as a tensor
};

const std::vector<ScalarOp>& scalar_ops() {
  static const Tensor mask = from_vector<float>({1, 0, 0, 1, 1, 0}, {2, 3}).to(kBool);
  static const std::vector<ScalarOp> ops = {
      {"add", [](const Tensor& t, Scalar s) { return add(t, s); }, [](const Tensor& t, const Tensor& s) { return add(t, s); }},
      {"sub", [](const Tensor& t, Scalar s) { return sub(t, s); }, [](const Tensor& t, const Tensor& s) { return sub(t, s); }},
      {"rsub", [](const Tensor& t, Scalar s) { return rsub(t, s); }, [](const Tensor& t, const Tensor& s) { return sub(s, t); }},
      {"mul", [](const Tensor& t, Scalar s) { return mul(t, s); }, [](const Tensor& t, const Tensor& s) { return mul(t, s); }},
      {"div", [](const Tensor& t, Scalar s) { return div(t, s); }, [](const Tensor& t, const Tensor& s) { return div(t, s); }},
      {"rdiv", [](const Tensor& t, Scalar s) { return rdiv(t, s); }, [](const Tensor& t, const Tensor& s) { return div(s, t); }},
      {"eq", [](const Tensor& t, Scalar s) { return eq(t, s); }, [](const Tensor& t, const Tensor& s) { return eq(t, s); }},
      {"ne", [](const Tensor& t, Scalar s) { return ne(t, s); }, [](const Tensor& t, const Tensor& s) { return ne(t, s); }},
      {"lt", [](const Tensor& t, Scalar s) { return lt(t, s); }, [](const Tensor& t, const Tensor& s) { return lt(t, s); }},
      {"le", [](const Tensor& t, Scalar s) { return le(t, s); }, [](const Tensor& t, const Tensor& s) { return le(t, s); }},
      {"gt", [](const Tensor& t, Scalar s) { return gt(t, s); }, [](const Tensor& t, const Tensor& s) { return gt(t, s); }},
      {"ge", [](const Tensor& t, Scalar s) { return ge(t, s); }, [](const Tensor& t, const Tensor& s) { return ge(t, s); }},
      {"where_other", [](const Tensor& t, Scalar s) { return where(mask, t, s); },
       [](const Tensor& t, const Tensor& s) { return where(mask, t, s); }},
      {"where_input", [](const Tensor& t, Scalar s) { return where(mask, s, t); },
       [](const Tensor& t, const Tensor& s) { return where(mask, s, t); }},
  };
  return ops;
}

// Runs f; returns its result, or the message of the ag::Error it threw.
std::pair<Tensor, std::string> attempt(const std::function<Tensor()>& f) {
  try {
    return {f(), ""};
  } catch (const Error& e) {
    return {Tensor(), e.what()};
  }
}

}  // namespace

TEST(ScalarOperands, AllocateOnlyTheOutput) {
  NoGradGuard no_grad;
  const Tensor t = randn({4, 5});
  const Tensor mask = gt(t, 0.0);
  Tensor y;
  EXPECT_EQ(allocations_of([&] { y = mul(t, 2.0); }), 1u);
  EXPECT_EQ(allocations_of([&] { y = t * 2.0; }), 1u);
  EXPECT_EQ(allocations_of([&] { y = add(t, 1); }), 1u);
  EXPECT_EQ(allocations_of([&] { y = gt(t, 0.5); }), 1u);
  EXPECT_EQ(allocations_of([&] { y = where(mask, t, 0.0); }), 1u);
  EXPECT_EQ(allocations_of([&] { y = where(mask, -INFINITY, t); }), 1u);
  EXPECT_EQ(allocations_of([&] { y = 1.0 - t; }), 1u);
  EXPECT_EQ(allocations_of([&] { y = 2.0 / t; }), 1u);
  EXPECT_EQ(allocations_of([&] { y = masked_fill(t, mask, 0.0); }), 1u);
  EXPECT_EQ(allocations_of([&] { y = add(t, t, 0.5); }), 2u);  // the output and t * alpha
  Tensor w = t.clone();
  EXPECT_EQ(allocations_of([&] { w.mul_(2.0).add_(1).masked_fill_(mask, 3.0); }), 0u);
}

TEST(ScalarOperands, RecordTheScalarByValue) {
  Tensor x = randn({3}).requires_grad_();
  Tensor y;
  // With grad on, only the output is allocated: no tensor is made, let alone saved, for 2.0.
  EXPECT_EQ(allocations_of([&] { y = mul(x, 2.0); }), 1u);
  ASSERT_TRUE(y.grad_fn());
  EXPECT_EQ(y.grad_fn()->name(), "MulBackward");
  EXPECT_EQ(y.grad_fn()->next_edges.size(), 1u);  // an edge for x alone
  y.sum().backward();
  EXPECT_TRUE(agt::allclose(x.grad(), full({3}, 2.0), 0, 0));
}

TEST(ScalarOperands, SameBitsAsTheTensorPath) {
  for (DType dt : all_dtypes()) {
    const Tensor t = sample(dt);
    for (Scalar s : scalars()) {
      for (const ScalarOp& op : scalar_ops()) {
        const auto [got, got_error] = attempt([&] { return op.by_value(t, s); });
        const auto [ref, ref_error] = attempt([&] { return op.by_tensor(t, as_tensor(t, s)); });
        SCOPED_TRACE(std::string(op.name) + " on " + describe(dt, s));
        EXPECT_EQ(got_error, ref_error);
        if (!got.defined() || !ref.defined()) continue;
        EXPECT_EQ(got.dtype(), ref.dtype());
        EXPECT_EQ(got.sizes(), ref.sizes());
        EXPECT_EQ(bytes_of(got), bytes_of(ref));
      }
      // masked_fill converts the value to the input's dtype; in place, the same as out of place.
      const Tensor mask = from_vector<float>({0, 1, 1, 0, 0, 1}, {2, 3}).to(kBool);
      const Tensor filled = masked_fill(t, mask, s);
      EXPECT_EQ(bytes_of(filled), bytes_of(where(mask, scalar_tensor(s, TensorOptions(dt)), t))) << describe(dt, s);
      Tensor inplace = t.clone();
      inplace.masked_fill_(mask, s);
      EXPECT_EQ(bytes_of(inplace), bytes_of(filled)) << describe(dt, s);
    }
  }
}

TEST(ScalarOperands, InPlaceSameBitsAsTheTensorPath) {
  for (DType dt : all_dtypes()) {
    for (Scalar s : scalars()) {
      using InPlace = std::function<void(Tensor&, Scalar)>;
      using InPlaceT = std::function<void(Tensor&, const Tensor&)>;
      const std::vector<std::tuple<const char*, InPlace, InPlaceT>> ops = {
          {"add_", [](Tensor& t, Scalar v) { t.add_(v); }, [](Tensor& t, const Tensor& v) { t.add_(v); }},
          {"sub_", [](Tensor& t, Scalar v) { t.sub_(v); }, [](Tensor& t, const Tensor& v) { t.sub_(v); }},
          {"mul_", [](Tensor& t, Scalar v) { t.mul_(v); }, [](Tensor& t, const Tensor& v) { t.mul_(v); }},
          {"div_", [](Tensor& t, Scalar v) { t.div_(v); }, [](Tensor& t, const Tensor& v) { t.div_(v); }},
      };
      for (const auto& entry : ops) {
        const auto& name = std::get<0>(entry);
        const auto& by_value = std::get<1>(entry);
        const auto& by_tensor = std::get<2>(entry);
        // An integral tensor divided by 0 in place would convert inf to an integer.
        if (s.to_double() == 0 && !is_floating(dt) && std::string(name) == "div_") continue;
        Tensor a = sample(dt), b = sample(dt);
        const auto [ra, ea] = attempt([&] { by_value(a, s); return a; });
        const auto [rb, eb] = attempt([&] { by_tensor(b, as_tensor(b, s)); return b; });
        SCOPED_TRACE(std::string(name) + " on " + describe(dt, s));
        EXPECT_EQ(ea, eb);
        EXPECT_EQ(bytes_of(a), bytes_of(b));
      }
    }
  }
}

// What each op's result dtype is, written out for every dtype and kind of scalar (PyTorch's
// promotion), and checked against result_type too.
TEST(ScalarOperands, ResultDtypesFollowResultType) {
  const DType f32 = kFloat32, f64 = kFloat64, f16 = kFloat16, bf16 = kBFloat16, i64 = kInt64, i32 = kInt32,
              u8 = kUInt8, b = kBool;
  //                         tensor  with bool  with int  with float
  const std::vector<std::tuple<DType, DType, DType, DType>> table = {
      {f32, f32, f32, f32}, {f64, f64, f64, f64}, {f16, f16, f16, f16}, {bf16, bf16, bf16, bf16},
      {i64, i64, i64, f32}, {i32, i32, i32, f32}, {u8, u8, u8, f32},    {b, b, i64, f32},
  };
  const Tensor mask = from_vector<float>({1, 0, 0, 1, 1, 0}, {2, 3}).to(kBool);
  for (const auto& [dt, with_bool, with_int, with_float] : table) {
    const Tensor t = sample(dt);
    for (const auto& [s, expected] : {std::pair<Scalar, DType>{Scalar(true), with_bool}, {Scalar(2), with_int},
                                      {Scalar(0.5), with_float}}) {
      SCOPED_TRACE(describe(dt, s));
      ASSERT_EQ(result_type(dt, s), expected);
      const DType floating = is_floating(expected) ? expected : get_default_dtype();
      if (expected == kBool) {
        EXPECT_AG_ERROR(add(t, s), "[add] not defined for bool tensors");
        EXPECT_AG_ERROR(mul(t, s), "[mul] not defined for bool tensors");
        EXPECT_AG_ERROR(rsub(t, s), "[sub] not defined for bool tensors");
      } else {
        EXPECT_EQ(add(t, s).dtype(), expected);
        EXPECT_EQ(sub(t, s).dtype(), expected);
        EXPECT_EQ(rsub(t, s).dtype(), expected);
        EXPECT_EQ(mul(t, s).dtype(), expected);
      }
      EXPECT_EQ(div(t, s).dtype(), floating);
      EXPECT_EQ(rdiv(t, s).dtype(), floating);
      EXPECT_EQ(gt(t, s).dtype(), kBool);
      EXPECT_EQ(eq(t, s).dtype(), kBool);
      EXPECT_EQ(where(mask, t, s).dtype(), expected);
      EXPECT_EQ(where(mask, s, t).dtype(), expected);
      EXPECT_EQ(masked_fill(t, mask, s).dtype(), dt);
    }
  }
}

TEST(ScalarOperands, GradientsOfTensorScalarOps) {
  manual_seed(3);
  const Tensor mask = from_vector<float>({1, 0, 1, 1, 0, 0}, {2, 3}).to(kBool);
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> ops = {
      {"add", [](const Tensor& x) { return add(x, 1.5); }},
      {"sub", [](const Tensor& x) { return sub(x, 2); }},
      {"rsub", [](const Tensor& x) { return 3.0 - x; }},
      {"mul", [](const Tensor& x) { return mul(x, -2.5); }},
      {"div", [](const Tensor& x) { return x / 0.7; }},
      {"rdiv", [](const Tensor& x) { return 2.0 / x; }},
      {"where_other", [&](const Tensor& x) { return where(mask, x, 0.25); }},
      {"where_input", [&](const Tensor& x) { return where(mask, -1.0, x); }},
      {"masked_fill", [&](const Tensor& x) { return masked_fill(x, mask, 4.0); }},
      {"chain", [](const Tensor& x) { return mul(add(x, 1.0), x) / 3.0 - 0.5; }},
      {"mul_inplace", [](const Tensor& x) {
         Tensor y = x * 1.0;
         y.mul_(1.75).sub_(0.5);
         return y;
       }},
  };
  for (const auto& entry : ops) {
    const auto& name = entry.first;
    const auto& f = entry.second;
    Tensor x = agt::rand64({2, 3}, 0.5, 2.0);  // away from 0, where rdiv has its pole
    EXPECT_TRUE(agt::gradcheck([&](const std::vector<Tensor>& in) { return f(in[0]); }, {x})) << name;
  }
}

// A tensor labelled with a CUDA device that no machine has (index 99), on host memory that
// is never touched: enough to follow an op to the point where it calls the CUDA backend,
// which refuses the device before any kernel could read host memory as device memory (on
// a GPU that fault would poison the context for every later test).
template <class T>
Tensor labelled_cuda(std::vector<T>& host) {
  auto storage = std::make_shared<Storage>();
  storage->data = host.data();
  storage->nbytes = host.size() * sizeof(T);
  storage->device = Device(kCUDA, 99);
  return Tensor(std::make_shared<TensorImpl>(storage, Shape{int64_t(host.size())}, Shape{1}, 0, dtype_of<T>));
}

TEST(ScalarOperands, HostScalarGoesWithAnyDevice) {
  std::vector<float> host = {1, 2, 3};
  std::vector<uint8_t> host_mask = {1, 0, 1};
  const Tensor dev = labelled_cuda(host);
  const Tensor two = scalar_tensor(2.0);  // 0-dim, on the CPU
  Tensor cond = labelled_cuda(host_mask);
  cond.unsafe_impl()->dtype = kBool;
  // The op gets past its device check and reaches the CUDA backend (which refuses device
  // 99, or is not built): the host scalar was accepted as a scalar, read in place, not
  // through item() (no host sync).
  for (const auto& entry : std::vector<std::pair<std::string, std::function<void()>>>{
           {"mul", [&] { (void)mul(dev, two); }},
           {"sub", [&] { (void)sub(two, dev); }},
           {"gt", [&] { (void)gt(dev, two); }},
           {"where", [&] { (void)where(cond, dev, two); }},
           {"add_", [&] { Tensor d = dev; d.add_(two); }}}) {
    const auto& name = entry.first;
    const auto& f = entry.second;
    std::string e;
    EXPECT_EQ(agt::host_syncs_of([&] { e = agt::error_of(f); }), std::vector<std::string>{}) << name;
    EXPECT_FALSE(agt::contains(e, "one device")) << name << ": " << e;
    EXPECT_TRUE(agt::contains(e, "cuda") || agt::contains(e, "CUDA")) << name << ": " << e;
  }
  // Only a 0-dim CPU tensor acts as a scalar.
  EXPECT_AG_ERROR(mul(dev, from_vector<float>({2}, {1})), "[mul] expected tensors on one device, got cuda:99 and cpu");
  EXPECT_AG_ERROR(gt(two.view({1}), dev), "[gt] expected tensors on one device, got cpu and cuda:99");
}
