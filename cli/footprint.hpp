#pragma once
/// What a process holds of the host, read from /proc: for a long run to show that nothing grows.
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace ferry::cli {

struct footprint {
  std::uint64_t rss_kib = 0;  ///< resident set (VmRSS)
  std::uint64_t fds = 0;      ///< open file descriptors
};

/// Process `pid`'s footprint now; none once it is gone.
std::optional<footprint> footprint_of(pid_t pid);

/// The footprints of named processes at two moments of a run, and how much each grew.
class footprint_log {
 public:
  /// Records every process of `processes` (pid to name): the first call at the first moment,
  /// the second at the other; later calls do nothing.
  void sample(const std::map<pid_t, std::string>& processes);
  bool complete() const { return samples_ == 2; }
  /// Per process alive at both moments: both footprints; and the largest growth of either, as a
  /// fraction of the first.
  nlohmann::json to_json() const;

 private:
  std::map<pid_t, std::string> names_;
  std::map<pid_t, footprint> first_, second_;
  int samples_ = 0;
};

}  // namespace ferry::cli
