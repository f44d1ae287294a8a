// The API's calls for the whole process: its version, the log level, the clean-up of a killed
// member's files, and the error category. The public objects are in coordinator.cpp,
// trainer.cpp and rollout.cpp.
#include "ferry/ferry.hpp"

#include <fmt/format.h>

#include <fstream>

#include "api/member_thread.hpp"
#include "runtime/log.hpp"
#include "transport/fabric/fabric_transport.hpp"

namespace ferry {

using api::failed;

const char* version_string() noexcept {
  return "0.2.0";
}

status clean_up_killed_process(std::int32_t pid, std::size_t* removed) {
  if (removed) *removed = 0;
  if (pid <= 0)
    return failed(api_errc::invalid_argument, fmt::format("clean_up_killed_process: pid {}", pid));
  // Dead and not reaped is a zombie; reaped, it has no /proc entry. Anything else still runs.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (std::getline(stat, line)) {
    const auto name_end = line.rfind(')');
    const char state =
        name_end != std::string::npos && name_end + 2 < line.size() ? line[name_end + 2] : '?';
    if (state != 'Z' && state != 'X')
      return failed(
          api_errc::invalid_argument,
          fmt::format("clean_up_killed_process: process {} still runs; its files are in use", pid));
  }
  const auto count = remove_shm_regions_of(pid);
  if (removed) *removed = count;
  return {};
}

status set_log_level(const std::string& level) {
  const auto parsed = log::parse_level(level);
  if (!parsed) {
    return failed(api_errc::invalid_argument,
                  fmt::format("log level '{}': one of debug, info, warn, error, off", level));
  }
  log::set_level(*parsed);
  return {};
}

const std::error_category& api_category() noexcept {
  struct category final : std::error_category {
    const char* name() const noexcept override { return "ferry"; }
    std::string message(int e) const override {
      switch (static_cast<api_errc>(e)) {
        case api_errc::invalid_argument:
          return "invalid argument";
        case api_errc::closed:
          return "closed";
        case api_errc::not_joined:
          return "not joined";
        case api_errc::already_joined:
          return "already joined";
        case api_errc::busy:
          return "the previous version is still offloading";
        case api_errc::timed_out:
          return "timed out";
        case api_errc::unreachable:
          return "unreachable";
        case api_errc::job_failed:
          return "the job failed";
        case api_errc::update_failed:
          return "the update failed";
      }
      return "unknown ferry error";
    }
  };
  static const category c;
  return c;
}

}  // namespace ferry
