#pragma once
/// Connections turned away before their handshake (refused by a limit, closed to make room, timed
/// out, failed), summed up in one log line per period with a count per source and reason: a flood
/// of connections costs the log a line a second, never a line per connection.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

namespace ferry {

/// Thread rules: one thread (the transport's loop). Times are passed in, so tests step them.
class refusal_report {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  /// At most one line per `period`; a line names up to `max_listed` (source, reason) pairs and
  /// sums up the rest; at most `max_kept` pairs are told apart between two lines.
  explicit refusal_report(std::chrono::milliseconds period = std::chrono::seconds(1),
                          std::size_t max_listed = 6, std::size_t max_kept = 64)
      : period_(period), max_listed_(max_listed), max_kept_(max_kept) {}

  /// Counts one connection from `source` turned away for `reason`. True when a line is due now
  /// (call `take`); otherwise the line waits for `due()`.
  bool add(const std::string& source, const std::string& reason, time_point now);

  /// The line for everything counted since the last one ("" when nothing was); the next line is
  /// due one period after `now`.
  std::string take(time_point now);

  bool empty() const { return counted_ == 0; }
  /// When the next line may be written.
  time_point due() const;
  /// Connections counted since the last line.
  std::uint64_t counted() const { return counted_; }

 private:
  std::chrono::milliseconds period_;
  std::size_t max_listed_;
  std::size_t max_kept_;
  std::optional<time_point> last_line_;
  time_point first_counted_{};
  std::uint64_t counted_ = 0;
  std::uint64_t unsorted_ = 0;  ///< counted past `max_kept` distinct pairs
  std::map<std::pair<std::string, std::string>, std::uint64_t> counts_;
};

}  // namespace ferry
