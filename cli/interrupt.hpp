#pragma once
/// SIGINT and SIGTERM as a stop request: the handler only records the signal; a thread of its own
/// turns it into a `std::stop_token` that each command observes where it waits (its event loop,
/// its children), so that every command unwinds, stops its children and exits 128 + the signal.
#include <chrono>
#include <stop_token>

namespace ferry::cli {

/// Installs the handlers for SIGINT and SIGTERM (once per process, before a command runs). They
/// replace handlers that libraries installed at load time (psm's libinfinipath calls exit() from
/// its own, under the feet of running threads); a signal this process inherited as ignored stays
/// ignored. A second signal ends the process at once: the way out of a stop that hangs.
void watch_interrupts();

/// Requested once SIGINT or SIGTERM arrived (after `watch_interrupts`).
std::stop_token interrupt_token();

/// Readable once SIGINT or SIGTERM arrived, for waits in poll(); never drained.
int interrupt_fd();

/// The first signal that arrived, or 0.
int interrupt_signal();

/// The exit status of an interrupted command: 128 + the signal (130 for SIGINT, 143 for SIGTERM).
int interrupted_exit_code();

/// "SIGINT" or "SIGTERM".
const char* interrupt_name();

/// Sleeps up to `d`; false when an interrupt arrived (before or during the sleep).
bool sleep_unless_interrupted(std::chrono::milliseconds d);

}  // namespace ferry::cli
