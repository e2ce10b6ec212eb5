// Learning-rate schedules. A Schedule maps (step, base lr) to a learning rate; schedules
// compose (Sequence switches at milestones, Chain multiplies factors), and one
// LRScheduler applies a schedule to an optimizer's groups each time step() is called:
//   auto s = ag::optim::Sequence({ag::optim::LinearWarmup({.steps = 100}),
//                                 ag::optim::CosineAnnealing({.t_max = 900})}, {100});
//   ag::optim::LRScheduler sched(opt, s);  ...  opt.step(); sched.step();
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ampgrad/optim/optimizer.h"

namespace ampgrad::optim {

class Schedule {
 public:
  virtual ~Schedule() = default;
  /// The learning rate at step t (t = 0 before the first step) for a group whose base
  /// learning rate is base_lr.
  virtual double lr(int64_t t, double base_lr) const = 0;
};
using SchedulePtr = std::shared_ptr<const Schedule>;

struct StepOptions {
  int64_t step_size = 1;
  double gamma = 0.1;
};
/// base * gamma^floor(t / step_size).
SchedulePtr StepDecay(StepOptions o);

struct CosineOptions {
  int64_t t_max = 1;
  double eta_min = 0;
};
/// eta_min + (base - eta_min) (1 + cos(pi t / t_max)) / 2, constant at eta_min after t_max.
SchedulePtr CosineAnnealing(CosineOptions o);

struct WarmupOptions {
  int64_t steps = 1;
  double start_factor = 0.0;
};
/// base * (start + (1 - start) min(t, steps) / steps).
SchedulePtr LinearWarmup(WarmupOptions o);

/// parts[i] runs from milestones[i-1] to milestones[i], with its own step count from 0.
SchedulePtr Sequence(std::vector<SchedulePtr> parts, std::vector<int64_t> milestones);
/// The product of the factors of each schedule (each applied to the previous result).
SchedulePtr Chain(std::vector<SchedulePtr> parts);

class LRScheduler {
 public:
  /// Remembers each group's current learning rate as its base and applies step 0.
  LRScheduler(Optimizer& opt, SchedulePtr schedule);
  /// Advances one step and sets every group's learning rate.
  void step();
  int64_t last_step() const { return t_; }
  /// Jumps to step t (t >= 0) and sets every group's learning rate: restoring a checkpoint.
  void set_last_step(int64_t t);
  double last_lr(size_t group = 0) const { return opt_.lr(group); }

 private:
  Optimizer& opt_;
  SchedulePtr schedule_;
  std::vector<double> base_;
  int64_t t_ = 0;
};

}  // namespace ampgrad::optim
