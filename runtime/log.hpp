#pragma once
/// Leveled logging to stderr, one line per record, safe from any thread.
#include <fmt/format.h>

#include <optional>
#include <string_view>

namespace ferry::log {

enum class level { debug, info, warn, error, off };

/// Sets the process-wide threshold (default: info, or FERRY_LOG=debug|info|warn|error|off).
void set_level(level l);
/// "debug", "info", "warn", "error" or "off" as a level; nullopt for anything else.
std::optional<level> parse_level(std::string_view name);
level threshold();
void write(level l, std::string_view line);

template <class... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  if (threshold() <= level::debug) write(level::debug, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (threshold() <= level::info) write(level::info, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (threshold() <= level::warn) write(level::warn, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  if (threshold() <= level::error) write(level::error, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace ferry::log
