#include "transport/tcp/process_copier.hpp"

#include <fmt/format.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "transport/errc.hpp"

namespace ferry {
namespace {

/// One system call moves at most this much (the kernel caps a call near 2 GiB anyway).
constexpr std::size_t max_call_bytes = std::size_t{1} << 30;

/// Copies one piece; 0 or an errno.
int read_piece(pid_t pid, std::uint64_t source, std::span<std::byte> target) {
  while (!target.empty()) {
    const auto n = std::min(target.size(), max_call_bytes);
    const iovec local{target.data(), n};
    const iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(source)), n};
    const auto got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (got == 0) return EIO;  // nothing moved and no error: never loop on it
    target = target.subspan(static_cast<std::size_t>(got));
    source += static_cast<std::uint64_t>(got);
  }
  return 0;
}

}  // namespace

/// Lets `stop` and `forget_region` wait for the pieces running on the pool and keep the others
/// from starting.
struct process_copier::gate {
  std::mutex mutex;
  std::condition_variable idle;
  bool stopped = false;
  std::map<std::uint64_t, unsigned> running;  ///< pieces running per region, absent when none
  /// Kept for good, so that a late copy into one is skipped too (a few bytes per deregistration).
  std::set<std::uint64_t> forgotten;

  bool enter(std::uint64_t region) {
    std::lock_guard lock(mutex);
    if (stopped || forgotten.contains(region)) return false;
    ++running[region];
    return true;
  }
  void leave(std::uint64_t region) {
    std::lock_guard lock(mutex);
    if (const auto it = running.find(region); --it->second == 0) running.erase(it);
    idle.notify_all();
  }
};

process_copier::process_copier(event_loop& loop, unsigned threads)
    : loop_(loop), gate_(std::make_shared<gate>()), pool_(threads) {}

process_copier::~process_copier() {
  stop();
}

void process_copier::forget_region(std::uint64_t region) {
  std::unique_lock lock(gate_->mutex);
  gate_->forgotten.insert(region);
  gate_->idle.wait(lock, [&] { return !gate_->running.contains(region); });
}

void process_copier::stop() {
  std::unique_lock lock(gate_->mutex);
  gate_->stopped = true;
  gate_->idle.wait(lock, [this] { return gate_->running.empty(); });
}

void process_copier::async_copy(pid_t pid, std::uint64_t source, std::span<std::byte> target,
                                std::uint64_t region, completion done) {
  // Pieces report on the loop; the last one to report completes the copy. Each piece writes only
  // its own slot of `errors`, which the loop reads after the pool posted that piece's report.
  struct copy {
    completion done;
    std::vector<int> errors;
    std::size_t left;
  };
  const auto piece_bytes = std::clamp((target.size() + pool_.threads() - 1) / pool_.threads(),
                                      min_piece_bytes, max_piece_bytes);
  const auto pieces = (target.size() + piece_bytes - 1) / piece_bytes;
  if (pieces == 0) {
    loop_.post([done = std::move(done)] { done(0); });
    return;
  }
  auto c = std::make_shared<copy>(copy{std::move(done), std::vector<int>(pieces, 0), pieces});
  for (std::size_t i = 0; i < pieces; ++i) {
    const auto offset = i * piece_bytes;
    const auto part = target.subspan(offset, std::min(piece_bytes, target.size() - offset));
    auto work = [g = gate_, c, i, pid, from = source + offset, part, region] {
      if (!g->enter(region)) {
        c->errors[i] = ECANCELED;
        return;
      }
      c->errors[i] = read_piece(pid, from, part);
      g->leave(region);
    };
    auto report = [c] {
      if (--c->left > 0) return;
      const auto failed =
          std::find_if(c->errors.begin(), c->errors.end(), [](int e) { return e != 0; });
      c->done(failed == c->errors.end() ? 0 : *failed);
    };
    pool_.async_run(loop_, std::move(work), std::move(report));
  }
}

std::error_code copy_error_code(int error) {
  return error == EPERM ? transport_errc::copy_not_permitted : transport_errc::copy_failed;
}

std::string copy_error_text(int error, pid_t pid) {
  switch (error) {
    case EPERM:
      return fmt::format(
          "not permitted to read process {} (process_vm_readv: EPERM): both processes must run as "
          "the same user, and with Yama kernel.yama.ptrace_scope=1 the writer must allow it (the "
          "cma transport does at start); ptrace_scope 2 needs CAP_SYS_PTRACE, 3 forbids it",
          pid);
    case ESRCH:
      return fmt::format("no process {} on this host (ESRCH): the writer is gone", pid);
    case EFAULT:
      return fmt::format("the source bytes are not readable in process {} (EFAULT)", pid);
    case EIO:
      return fmt::format("short read from process {}: fewer bytes than announced", pid);
    case ECANCELED:
      return "skipped: the copier stopped, or its target region was deregistered, before the copy "
             "ran";
    default:
      return fmt::format("process_vm_readv from process {}: {}", pid, std::strerror(error));
  }
}

}  // namespace ferry
