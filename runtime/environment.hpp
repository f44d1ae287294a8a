#pragma once
/// What a node hands its actors: the loop, time, CPU work, copies, the platform and the timeline.
/// Actors and collectives reach time, threads and the OS only through it, so the same code runs
/// in its own process, inside a user's program and on virtual time.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <system_error>

#include "runtime/errc.hpp"

namespace ferry {

class clock;
class copy_engine;
class event_loop;
class host_buffer;
class trace;
struct shared_memory_ref;

/// CPU work off the loop (hashing, host copies). Owning loop only; completions run on the loop.
class executor {
 public:
  virtual ~executor() = default;
  /// Runs `work()` off the loop, then `done()` on it. `bytes`: what the work touches, which is
  /// its cost on virtual time.
  virtual void async_run(std::uint64_t bytes, std::function<void()> work,
                         std::function<void()> done) = 0;
  /// How many works may run at once (a large copy is split that many ways).
  virtual unsigned parallelism() const = 0;
  /// Fiber only: runs `work()` and suspends the calling fiber until it finished.
  void run(std::uint64_t bytes, std::function<void()> work);
};

/// The operating system as actors see it. Owning loop only.
class platform {
 public:
  virtual ~platform() = default;
  /// Whether process `pid` of this host still exists.
  virtual bool process_alive(std::int32_t pid) = 0;
  /// Maps another process's shareable buffer; fails saying why in `why`.
  virtual result<host_buffer> map_shared(const shared_memory_ref& ref, std::string& why) = 0;
  /// Runs `work`, which blocks its thread for long (pinning gigabytes, a communicator's set-up),
  /// on a thread of its own: never on the loop (heartbeats) nor on a pool thread (CUDA state on
  /// a thread that outlives main crashes the process at exit). Completion
  /// `void(std::error_code)`, on the loop, with what `work` returned.
  virtual void async_blocking(std::function<std::error_code()> work,
                              std::function<void(std::error_code)> done) = 0;
  /// Host memory for host copies, staging slots and tensors (`shareable`: in a memfd that
  /// `map_shared` opens). A simulation hands out sizes whose bytes never exist.
  virtual host_buffer host_memory(std::size_t bytes, bool shareable = false);
  /// Bytes of host memory this process may still take before the kernel swaps or kills; none
  /// where that is not known (a simulation, whose host memory holds no bytes).
  virtual std::optional<std::uint64_t> available_host_memory() { return std::nullopt; }
};

/// Owning loop only. Outlives every node and actor that uses it.
class environment {
 public:
  virtual ~environment() = default;
  virtual event_loop& loop() = 0;
  virtual class clock& clock() = 0;
  virtual executor& cpu() = 0;
  virtual copy_engine& copies() = 0;
  virtual class platform& platform() = 0;
  virtual class trace& trace() = 0;
  /// Virtual time: the loop jumps the clock to the next timer when nothing is ready.
  virtual bool is_virtual() const = 0;
};

}  // namespace ferry
