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
  return parse_level(v ? v : "").value_or(level::info);
}

std::atomic<level>& current() {
  static std::atomic<level> l{from_environment()};
  return l;
}

}  // namespace

void set_level(level l) {
  current() = l;
}

std::optional<level> parse_level(std::string_view name) {
  if (name == "debug") return level::debug;
  if (name == "info") return level::info;
  if (name == "warn") return level::warn;
  if (name == "error") return level::error;
  if (name == "off") return level::off;
  return std::nullopt;
}
level threshold() {
  return current();
}

void write(level l, std::string_view line) {
  static constexpr const char* names[] = {"debug", "info", "warn", "error"};
  static std::mutex mutex;
  const auto since_start =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch());
  std::lock_guard lock(mutex);
  std::fprintf(stderr, "[%.3f %s] %.*s\n", since_start.count(), names[static_cast<int>(l)],
               static_cast<int>(line.size()), line.data());
}

}  // namespace ferry::log
