#include "transport/tcp/refusal_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <vector>

namespace ferry {

bool refusal_report::add(const std::string& source, const std::string& reason, time_point now) {
  if (counted_ == 0) first_counted_ = now;
  ++counted_;
  auto key = std::pair(source, reason);
  if (auto it = counts_.find(key); it != counts_.end()) {
    ++it->second;
  } else if (counts_.size() < max_kept_) {
    counts_.emplace(std::move(key), 1);
  } else {
    ++unsorted_;  // many sources at once: their sum still shows
  }
  return now >= due();
}

refusal_report::time_point refusal_report::due() const {
  return last_line_ ? *last_line_ + period_ : time_point::min();
}

std::string refusal_report::take(time_point now) {
  last_line_ = now;
  if (counted_ == 0) return {};
  std::vector<std::pair<std::uint64_t, const std::pair<std::string, std::string>*>> ranked;
  for (const auto& [key, n] : counts_) ranked.emplace_back(n, &key);
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string line;
  if (counted_ == 1 && ranked.size() == 1) {
    const auto& [source, reason] = *ranked.front().second;
    line = fmt::format("turned away a connection from {} before its handshake: {}", source, reason);
  } else {
    const double seconds = std::chrono::duration<double>(now - first_counted_).count();
    line = fmt::format("turned away {} connections before their handshake in {:.1f} s:", counted_,
                       seconds);
    std::size_t listed = 0;
    std::uint64_t rest = unsorted_;
    std::set<std::string> other_sources;
    for (const auto& [n, key] : ranked) {
      if (listed < max_listed_) {
        line +=
            fmt::format("{} {} from {} ({})", listed == 0 ? "" : ";", n, key->first, key->second);
        ++listed;
      } else {
        rest += n;
        other_sources.insert(key->first);
      }
    }
    if (rest > 0) {
      line += unsorted_ > 0
                  ? fmt::format("; {} more from other sources", rest)
                  : fmt::format("; {} more from {} source(s)", rest, other_sources.size());
    }
  }
  counts_.clear();
  counted_ = 0;
  unsorted_ = 0;
  return line;
}

}  // namespace ferry
