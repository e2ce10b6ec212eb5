#include "ampgrad/optim/scheduler.h"

#include <cmath>

namespace ampgrad::optim {

namespace {

template <class F>
class FnSchedule final : public Schedule {
 public:
  explicit FnSchedule(F f) : f_(std::move(f)) {}
  double lr(int64_t t, double base) const override { return f_(t, base); }

 private:
  F f_;
};

template <class F>
SchedulePtr make(F f) {
  return std::make_shared<FnSchedule<F>>(std::move(f));
}

}  // namespace

SchedulePtr StepDecay(StepOptions o) {
  AG_CHECK(o.step_size > 0, "StepDecay", "step_size must be positive, got ", o.step_size);
  return make([o](int64_t t, double base) { return base * std::pow(o.gamma, double(t / o.step_size)); });
}

SchedulePtr CosineAnnealing(CosineOptions o) {
  AG_CHECK(o.t_max > 0, "CosineAnnealing", "t_max must be positive, got ", o.t_max);
  return make([o](int64_t t, double base) {
    const double x = double(std::min(t, o.t_max)) / double(o.t_max);
    return o.eta_min + (base - o.eta_min) * (1 + std::cos(M_PI * x)) / 2;
  });
}

SchedulePtr LinearWarmup(WarmupOptions o) {
  AG_CHECK(o.steps > 0, "LinearWarmup", "steps must be positive, got ", o.steps);
  AG_CHECK(o.start_factor >= 0 && o.start_factor <= 1, "LinearWarmup", "start_factor must be in [0, 1], got ",
           o.start_factor);
  return make([o](int64_t t, double base) {
    const double f = double(std::min(t, o.steps)) / double(o.steps);
    return base * (o.start_factor + (1 - o.start_factor) * f);
  });
}

SchedulePtr Sequence(std::vector<SchedulePtr> parts, std::vector<int64_t> milestones) {
  AG_CHECK(!parts.empty() && milestones.size() + 1 == parts.size(), "Sequence", "expected ",
           parts.size() - (parts.empty() ? 0 : 1), " milestones for ", parts.size(), " schedules, got ",
           milestones.size());
  for (size_t i = 0; i < milestones.size(); ++i)
    AG_CHECK(milestones[i] > 0 && (i == 0 || milestones[i] > milestones[i - 1]), "Sequence",
             "milestones must be positive and increasing");
  return make([parts, milestones](int64_t t, double base) {
    size_t i = 0;
    int64_t start = 0;
    while (i < milestones.size() && t >= milestones[i]) start = milestones[i++];
    return parts[i]->lr(t - start, base);
  });
}

SchedulePtr Chain(std::vector<SchedulePtr> parts) {
  AG_CHECK(!parts.empty(), "Chain", "expected at least one schedule");
  return make([parts](int64_t t, double base) {
    double lr = base;
    for (const auto& p : parts) lr = p->lr(t, lr);
    return lr;
  });
}

LRScheduler::LRScheduler(Optimizer& opt, SchedulePtr schedule) : opt_(opt), schedule_(std::move(schedule)) {
  AG_CHECK(schedule_ != nullptr, "LRScheduler", "schedule is null");
  for (size_t g = 0; g < opt_.num_groups(); ++g) base_.push_back(opt_.lr(g));
  for (size_t g = 0; g < base_.size(); ++g) opt_.set_lr(g, schedule_->lr(0, base_[g]));
}

void LRScheduler::step() { set_last_step(t_ + 1); }

void LRScheduler::set_last_step(int64_t t) {
  AG_CHECK(t >= 0, "LRScheduler", "step must be >= 0, got ", t);
  t_ = t;
  for (size_t g = 0; g < base_.size(); ++g) opt_.set_lr(g, schedule_->lr(t_, base_[g]));
}

}  // namespace ampgrad::optim
