#pragma once
/// What a trainer and a rollout share until they join: the tensors registered, checked one by
/// one, and the waits on the member's state from any thread.
#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "actors/tensor.hpp"
#include "api/member_thread.hpp"
#include "ferry/ferry.hpp"

namespace ferry::api {

/// Waits on `cv` until `ready()` or `timeout`; the status `outcome()` gives, or timed_out.
template <class Ready, class Outcome>
status wait_for(std::mutex& m, std::condition_variable& cv, std::chrono::milliseconds timeout,
                Ready ready, Outcome outcome, const std::string& what) {
  std::unique_lock lock(m);
  if (!cv.wait_for(lock, timeout, ready))
    return failed(api_errc::timed_out,
                  fmt::format("{}: timed out after {} ms", what, timeout.count()));
  return outcome();
}

/// `t` as the actors' tensor_ref, or why not.
std::optional<tensor_ref> to_ref(const tensor& t, bool data_required, std::string& why);

/// The one device a member's tensors live on (-1: host memory), or why there is not one.
status member_device(const std::vector<tensor_ref>& tensors, const char* who, int& device);

/// What a trainer and a rollout share until they join: the tensor table, under `mutex`.
struct member_table {
  mutable std::mutex mutex;  ///< guards this table and the derived state's shared fields
  mutable std::condition_variable changed;
  std::vector<tensor_ref> tensors;
  std::set<std::string> names;
  bool joined = false, closed = false;
  bool ended = false;  ///< the coordinator ended the job
  std::optional<std::string> failure;
  std::string leave_reason = "closed";

  std::string reason_to_leave() const {
    std::lock_guard lock(mutex);
    return leave_reason;
  }

  /// Any thread: the member is closed, and leaves saying `reason` unless it was closed before.
  void mark_closed(const std::string& reason) {
    std::lock_guard lock(mutex);
    if (!closed) leave_reason = reason;
    closed = true;
    changed.notify_all();
  }

  /// Loop thread: the coordinator ended the job.
  void end() {
    std::lock_guard lock(mutex);
    ended = true;
    changed.notify_all();
  }
  status wait_end(std::chrono::milliseconds timeout, const char* who) const {
    return wait_for(
        mutex, changed, timeout, [&] { return ended || failure || closed; },
        [&]() -> status {
          if (failure) return failed(api_errc::job_failed, *failure);
          if (ended) return {};
          return failed(api_errc::closed, fmt::format("{}: closed", who));
        },
        fmt::format("{}: waiting for the job's end", who));
  }

  /// Registers `t`, or with `rows` ([first, first + count) of its first dimension) that part of it.
  status add(const tensor& t, bool data_required, const char* who,
             std::optional<std::pair<std::int64_t, std::int64_t>> rows = std::nullopt) {
    std::lock_guard lock(mutex);
    if (joined)
      return failed(api_errc::already_joined,
                    fmt::format("tensor '{}': registered after join", t.name));
    std::string why;
    auto ref = to_ref(t, data_required, why);
    if (!ref) return failed(api_errc::invalid_argument, fmt::format("{}: {}", who, why));
    if (rows) {
      const auto [first, count] = *rows;
      const std::int64_t all = t.shape.empty() ? 0 : t.shape[0];
      if (first < 0 || count < 1 || first > all || count > all - first) {
        return failed(api_errc::invalid_argument,
                      fmt::format("{}: tensor '{}': rows [{}, {}) lie outside its {} rows", who,
                                  t.name, first, first + count, all));
      }
      const std::uint64_t row_bytes = ref->spec.nbytes / static_cast<std::uint64_t>(all);
      ref->part = byte_range{static_cast<std::uint64_t>(first) * row_bytes,
                             static_cast<std::uint64_t>(count) * row_bytes};
    }
    if (!names.insert(t.name).second) {
      return failed(
          api_errc::invalid_argument,
          fmt::format("{}: tensor '{}' registered twice (one row range per tensor)", who, t.name));
    }
    tensors.push_back(*ref);
    return {};
  }
  /// The table to join with, or why this member cannot join.
  status ready_to_join(const char* who, bool may_be_empty, std::vector<tensor_ref>& out) const {
    std::lock_guard lock(mutex);
    if (closed) return failed(api_errc::closed, fmt::format("{}: closed", who));
    if (joined) return failed(api_errc::already_joined, fmt::format("{}: join called twice", who));
    if (tensors.empty() && !may_be_empty)
      return failed(api_errc::invalid_argument, fmt::format("{}: no tensor registered", who));
    out = tensors;
    return {};
  }
};

}  // namespace ferry::api
