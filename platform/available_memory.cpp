#include "platform/available_memory.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

namespace ferry {

namespace {

/// The number a cgroup file holds; none for "max" (no limit), a missing file or no number.
std::optional<std::uint64_t> read_number(const std::string& path) {
  std::ifstream in(path);
  std::uint64_t n = 0;
  if (!(in >> n)) return std::nullopt;
  return n;
}

/// `MemAvailable` of /proc/meminfo, in bytes.
std::optional<std::uint64_t> mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

/// This process's cgroup path for `controller` ("" for v2's unified line), from /proc/self/cgroup.
std::string cgroup_path(const std::string& controller) {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    const auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const auto names = line.substr(first + 1, second - first - 1);
    if (names == controller ||
        ("," + names + ",").find("," + controller + ",") != std::string::npos) {
      return line.substr(second + 1);
    }
  }
  return "";
}

/// Limit less usage of the cgroup: its own files, or (inside a container, whose namespace shows
/// its cgroup as the root) the root's.
std::optional<std::uint64_t> cgroup_room(const std::string& base, const std::string& path,
                                         const char* limit_file, const char* usage_file) {
  for (const auto& dir : {base + path, base}) {
    const auto limit = read_number(dir + "/" + limit_file);
    const auto usage = read_number(dir + "/" + usage_file);
    if (limit && usage) return *limit > *usage ? *limit - *usage : 0;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::uint64_t> available_host_memory() {
  auto room = mem_available();
  const auto lower = [&room](std::optional<std::uint64_t> cap) {
    if (cap) room = room ? std::min(*room, *cap) : *cap;
  };
  lower(cgroup_room("/sys/fs/cgroup", cgroup_path(""), "memory.max", "memory.current"));
  lower(cgroup_room("/sys/fs/cgroup/memory", cgroup_path("memory"), "memory.limit_in_bytes",
                    "memory.usage_in_bytes"));
  return room;
}

}  // namespace ferry
