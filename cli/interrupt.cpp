#include "cli/interrupt.hpp"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "runtime/host_buffer.hpp"

namespace ferry::cli {
namespace {

std::atomic<int> first_signal{0};
int signalled[2] = {-1, -1};    ///< the handler writes, the watcher thread reads
int interrupted[2] = {-1, -1};  ///< the watcher writes once; `interrupt_fd` reads nothing

/// Never destroyed: the watcher thread may still use it while the process exits.
std::stop_source& source() {
  static auto* s = new std::stop_source;
  return *s;
}

/// A command still running this long after the signal is stuck: say so and end it.
constexpr auto stuck_after = std::chrono::seconds(10);

/// Only async-signal-safe calls here.
extern "C" void on_interrupt(int signal) {
  int none = 0;
  if (!first_signal.compare_exchange_strong(none, signal)) _exit(128 + none);  // the second one
  const char byte = 1;
  [[maybe_unused]] const auto n = ::write(signalled[1], &byte, 1);
}

}  // namespace

void watch_interrupts() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (::pipe2(signalled, O_CLOEXEC) != 0 || ::pipe2(interrupted, O_CLOEXEC) != 0) return;
    // A stop request takes locks and runs callbacks: not in a signal handler, on a thread.
    std::thread([] {
      char byte = 0;
      while (::read(signalled[0], &byte, 1) < 0 && errno == EINTR) {
      }
      host_buffer::stop_prefaulting();  // a member being made skips the rest of its first touches
      source().request_stop();
      [[maybe_unused]] const auto n = ::write(interrupted[1], &byte, 1);
      std::this_thread::sleep_for(stuck_after);
      std::fprintf(stderr, "ferry: still running %lld s after %s; exiting\n",
                   static_cast<long long>(stuck_after.count()), interrupt_name());
      std::fflush(stderr);
      _exit(interrupted_exit_code());
    }).detach();
    for (const int signal : {SIGINT, SIGTERM}) {
      struct sigaction old {};
      if (sigaction(signal, nullptr, &old) == 0 && old.sa_handler == SIG_IGN)
        continue;  // nohup, `&`
      struct sigaction action {};
      action.sa_handler = on_interrupt;
      sigemptyset(&action.sa_mask);
      action.sa_flags = SA_RESTART;
      sigaction(signal, &action, nullptr);
    }
  });
}

std::stop_token interrupt_token() {
  return source().get_token();
}

int interrupt_fd() {
  return interrupted[0];
}

int interrupt_signal() {
  return first_signal.load();
}

int interrupted_exit_code() {
  return 128 + interrupt_signal();
}

const char* interrupt_name() {
  return interrupt_signal() == SIGTERM ? "SIGTERM" : "SIGINT";
}

bool sleep_unless_interrupted(std::chrono::milliseconds d) {
  static std::mutex m;
  static std::condition_variable_any woken;
  std::unique_lock lock(m);
  woken.wait_for(lock, interrupt_token(), d, [] { return false; });
  return !interrupt_token().stop_requested();
}

}  // namespace ferry::cli
