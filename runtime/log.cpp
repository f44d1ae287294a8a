#include "runtime/log.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace ferry::log {
namespace {

level from_environment() {
  const char* v = std::getenv("FERRY_LOG");
  const std::string s = v ? v : "";
  if (s == "debug") return level::debug;
  if (s == "warn") return level::warn;
  if (s == "error") return level::error;
  if (s == "off") return level::off;
  return level::info;
}

std::atomic<level>& current() {
  static std::atomic<level> l{from_environment()};
  return l;
}

}  // namespace

void set_level(level l) { current() = l; }
level threshold() { return current(); }

void write(level l, std::string_view line) {
  static constexpr const char* names[] = {"debug", "info", "warn", "error"};
  static std::mutex mutex;
  const auto since_start = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch());
  std::lock_guard lock(mutex);
  std::fprintf(stderr, "[%.3f %s] %.*s\n", since_start.count(), names[static_cast<int>(l)],
               static_cast<int>(line.size()), line.data());
}

}  // namespace ferry::log
