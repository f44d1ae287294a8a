#pragma once
/// Copies bytes out of another process of this host with `process_vm_readv` (Cross Memory
/// Attach): the kernel moves them in one copy, in pieces run in parallel on a pool of threads.
/// The receiving side of the tcp transport's same-host mode (scheme "cma").
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <system_error>

#include "platform/worker_pool.hpp"
#include "runtime/event_loop.hpp"

namespace ferry {

/// Thread rules: owning loop only; completions run on that loop.
class process_copier {
 public:
  /// A copy is cut into one piece per thread, each of at least `min_piece_bytes` (fewer, larger
  /// pieces for small copies) and at most `max_piece_bytes` (so that `stop` waits briefly).
  static constexpr std::size_t min_piece_bytes = std::size_t{4} << 20;
  static constexpr std::size_t max_piece_bytes = std::size_t{64} << 20;

  /// Completion of a copy: 0 when every byte arrived, else the errno of the first piece that
  /// failed (`EIO` for a read that stopped short, `ECANCELED` for a piece skipped by `stop` or
  /// `forget_region`).
  using completion = std::function<void(int error)>;

  /// `threads` = 0 picks the hardware concurrency.
  process_copier(event_loop& loop, unsigned threads);
  /// Calls `stop` and joins the pool.
  ~process_copier();
  process_copier(const process_copier&) = delete;
  process_copier& operator=(const process_copier&) = delete;

  /// Copies `target.size()` bytes at virtual address `source` of process `pid` into `target`,
  /// which lies in the caller's region `region` (any number naming what `forget_region` ends).
  /// `target` must stay valid until the completion ran, `forget_region(region)` or `stop`
  /// returned. Completion: once, on the loop, never inside this call.
  void async_copy(pid_t pid, std::uint64_t source, std::span<std::byte> target,
                  std::uint64_t region, completion done);

  /// Waits for the pieces copying into `region` now; its pieces not started yet are skipped, and
  /// so are later copies into it (`ECANCELED`): region numbers must not be reused. After it
  /// returns no byte lands in that region, so its owner may free it. Blocks, as `stop` does.
  void forget_region(std::uint64_t region);

  /// Waits for the pieces running now (tens of milliseconds at most); pieces not started yet are
  /// skipped, and so are later copies: their completions report `ECANCELED`. After it returns no
  /// byte lands in any target. Blocks the calling thread.
  void stop();

  unsigned threads() const { return pool_.threads(); }

 private:
  struct gate;
  event_loop& loop_;
  std::shared_ptr<gate> gate_;  ///< shared with the pieces queued on the pool
  worker_pool pool_;            ///< last: its threads are joined before the rest goes
};

/// The transport error of a failed copy (`copy_not_permitted` for EPERM, else `copy_failed`).
std::error_code copy_error_code(int error);
/// A one-line explanation of a failed copy from process `pid`, with what to check.
std::string copy_error_text(int error, pid_t pid);

}  // namespace ferry
