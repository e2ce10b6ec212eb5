#include "fiber.h"

#include <boost/context/protected_fixedsize_stack.hpp>
#include <cstdio>
#include <cstdlib>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AMPGRAD_EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define AMPGRAD_EMU_ASAN 1
#endif
#ifdef AMPGRAD_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

namespace ampgrad::emu::detail {
namespace {

namespace bc = boost::context::detail;

// AddressSanitizer keeps one stack per thread; these tell it that the thread is about to
// run on another stack (start) and that it now does (finish). No-ops without ASan.
void start_switch(void** fake_stack_save, const void* bottom, std::size_t size) {
#ifdef AMPGRAD_EMU_ASAN
  __sanitizer_start_switch_fiber(fake_stack_save, bottom, size);
#else
  (void)fake_stack_save, (void)bottom, (void)size;
#endif
}
void finish_switch(void* fake_stack_save, const void** bottom_old, std::size_t* size_old) {
#ifdef AMPGRAD_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake_stack_save, bottom_old, size_old);
#else
  (void)fake_stack_save, (void)bottom_old, (void)size_old;
#endif
}

}  // namespace

Fiber::Fiber(std::size_t stack_bytes, Entry entry, void* arg) : entry_(entry), arg_(arg) {
  stack_ = boost::context::protected_fixedsize_stack(stack_bytes).allocate();
  self_ = bc::make_fcontext(stack_.sp, stack_.size, &Fiber::trampoline);
}

Fiber::~Fiber() {
  if (self_ && !finished_) {
    std::fprintf(stderr, "ampgrad CUDA emulator: a fiber was destroyed before it finished\n");
    std::abort();
  }
  boost::context::protected_fixedsize_stack().deallocate(stack_);
}

// The first code on the fiber's stack: t.data is the fiber, t.fctx its first resumer.
void Fiber::trampoline(bc::transfer_t t) {
  Fiber* f = static_cast<Fiber*>(t.data);
  f->caller_ = t.fctx;
  finish_switch(nullptr, &f->caller_bottom_, &f->caller_size_);
  f->entry_(f->arg_);
  f->finished_ = true;
  // nullptr: this stack's fake frames die with it
  start_switch(nullptr, f->caller_bottom_, f->caller_size_);
  bc::jump_fcontext(f->caller_, nullptr);  // never comes back
}

void Fiber::resume() {
  void* fake = nullptr;
  start_switch(&fake, static_cast<char*>(stack_.sp) - stack_.size, stack_.size);
  self_ = bc::jump_fcontext(self_, this).fctx;
  finish_switch(fake, nullptr, nullptr);
}

void Fiber::suspend() {
  start_switch(&fake_stack_, caller_bottom_, caller_size_);
  caller_ = bc::jump_fcontext(caller_, nullptr).fctx;
  finish_switch(fake_stack_, &caller_bottom_, &caller_size_);
}

}  // namespace ampgrad::emu::detail
