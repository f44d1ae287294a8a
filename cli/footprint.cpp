#include "cli/footprint.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace ferry::cli {

std::optional<footprint> footprint_of(pid_t pid) {
  const auto dir = std::filesystem::path("/proc") / std::to_string(pid);
  std::ifstream status(dir / "status");
  if (!status) return std::nullopt;
  footprint f;
  for (std::string key; status >> key;) {
    if (key == "VmRSS:") {
      status >> f.rss_kib;
      break;
    }
    status.ignore(1 << 12, '\n');
  }
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir / "fd", ec), end; !ec && it != end;
       it.increment(ec))
    ++f.fds;
  if (ec) return std::nullopt;
  return f;
}

void footprint_log::sample(const std::map<pid_t, std::string>& processes) {
  if (complete()) return;
  auto& into = samples_ == 0 ? first_ : second_;
  for (const auto& [pid, name] : processes) {
    if (auto f = footprint_of(pid)) {
      into[pid] = *f;
      names_[pid] = name;
    }
  }
  ++samples_;
}

nlohmann::json footprint_log::to_json() const {
  const auto growth = [](std::uint64_t a, std::uint64_t b) {
    return a > 0 ? (static_cast<double>(b) - static_cast<double>(a)) / static_cast<double>(a) : 0.0;
  };
  nlohmann::json processes = nlohmann::json::array();
  double rss_growth = 0, fd_growth = 0;
  for (const auto& [pid, a] : first_) {
    const auto b = second_.find(pid);
    if (b == second_.end()) continue;  // killed in between
    processes.push_back({{"process", names_.at(pid)},
                         {"rss_kib", {a.rss_kib, b->second.rss_kib}},
                         {"fds", {a.fds, b->second.fds}}});
    rss_growth = std::max(rss_growth, growth(a.rss_kib, b->second.rss_kib));
    fd_growth = std::max(fd_growth, growth(a.fds, b->second.fds));
  }
  return {{"processes", processes}, {"rss_growth_max", rss_growth}, {"fds_growth_max", fd_growth}};
}

}  // namespace ferry::cli
