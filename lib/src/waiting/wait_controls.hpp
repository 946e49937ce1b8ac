// Waiting: what reaches every wait of the process from outside it (internal): the interrupt
// descriptor (a signal ends a wait) and the stall warning (a wait that lasts says so).
#pragma once

#include <chrono>
#include <string>

namespace lockstep::detail {

// Interrupting waits (lockstep_set_interrupt_fd): while the descriptor set here (-1: none) is
// readable, every wait of the process gives up (a signal handler's self-pipe, such as Python's
// signal.set_wakeup_fd: a signal that arrives while a wait sleeps ends the sleep with EINTR,
// and one that arrives while it spins is seen at its next check). Returns the previous one.
int set_interrupt_fd(int fd) noexcept;
// Whether the interrupt descriptor is readable (one poll(2), only while one is set).
bool interrupt_pending() noexcept;
// Throws InterruptedError ("<what>: interrupted by a signal") if interrupt_pending().
void check_interrupt(const std::string& what);
// Whether an interrupt descriptor is set: then an interruptible wait never sleeps without a
// timeout (the signal may be handled on another thread, and not end its sleep).
bool interrupt_armed() noexcept;
// From now on the calling thread's waits are not interrupted (interrupt_pending and
// interrupt_armed say no there): for a thread of the library's own (the GPU relay across nodes)
// that waits for the other nodes while the user's threads take the signals.
void ignore_interrupts_on_this_thread() noexcept;

// A wait that lasts says so (LOCKSTEP_STALL_WARNING, set by the context when it joins): after
// `after` (zero: never), then again after twice as long each time, a wait calls its site's
// stalled(), which names what it waits for. Returns the previous setting.
std::chrono::nanoseconds set_stall_warning(std::chrono::nanoseconds after) noexcept;
[[nodiscard]] std::chrono::nanoseconds stall_warning() noexcept;
// The stall line every site says, one wording for the node barrier, the join and the backends:
// "<what> has waited <s> s for <whom>; still waiting (LOCKSTEP_STALL_WARNING ...)", on stderr
// with the process's rank (base/log.hpp). Never throws: a wait goes on without its diagnostic.
void say_stalled(int rank, const char* what, std::chrono::nanoseconds waited,
                 const std::string& whom) noexcept;

}  // namespace lockstep::detail
