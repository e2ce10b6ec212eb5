// A fiber: a stack of its own and a function running on it, which gives control back to
// whoever resumed it whenever it calls suspend(). The emulator runs each CUDA thread of a
// block on one (exec.cpp). Built on Boost.Context's fcontext (make_fcontext and
// jump_fcontext, a few instructions per switch), with every switch announced to
// AddressSanitizer in ASan builds, so that it checks each fiber's stack as a stack.
#pragma once

#include <boost/context/detail/fcontext.hpp>
#include <boost/context/stack_context.hpp>
#include <cstddef>

namespace ampgrad::emu::detail {

class Fiber {
 public:
  using Entry = void (*)(void*);
  /// A fiber that will run entry(arg) on a fresh stack of stack_bytes (plus a guard page
  /// below it) at its first resume.
  Fiber(std::size_t stack_bytes, Entry entry, void* arg);
  /// The fiber must have finished (its entry returned).
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  /// From outside the fiber: runs it until it suspends or its entry returns.
  void resume();
  /// From inside the fiber: returns to the resume() that started this run.
  void suspend();
  bool finished() const { return finished_; }

 private:
  static void trampoline(boost::context::detail::transfer_t t);

  Entry entry_;
  void* arg_;
  boost::context::stack_context stack_{};
  boost::context::detail::fcontext_t self_ = nullptr;    // where the fiber goes on
  boost::context::detail::fcontext_t caller_ = nullptr;  // where its resumer goes on
  bool finished_ = false;
  // AddressSanitizer's view: the resumer's stack, and the fiber's fake stack while away.
  const void* caller_bottom_ = nullptr;
  std::size_t caller_size_ = 0;
  void* fake_stack_ = nullptr;
};

}  // namespace ampgrad::emu::detail
