#include "cli/launch.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "cli/interrupt.hpp"
#include "transport/fabric/fabric_transport.hpp"

namespace ferry::cli {
namespace {

/// fork + exec rather than posix_spawn, for the one call between them: the child dies with its
/// launcher, so a killed `ferry local` or `ferry chaos` leaves no job behind.
pid_t spawn_with(const std::vector<std::string>& args, int stdout_fd) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid;  // the launcher (or -1)
  // Only async-signal-safe calls from here on.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(127);  // the launcher died before prctl took effect
  setpgid(0, 0);
  if (stdout_fd >= 0 && dup2(stdout_fd, 1) < 0) _exit(127);
  execv(argv[0], argv.data());
  _exit(127);
}

}  // namespace

pid_t spawn(const std::vector<std::string>& args) {
  return spawn_with(args, -1);
}

std::pair<pid_t, int> spawn_reading(const std::vector<std::string>& args) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return {-1, -1};
  const pid_t pid = spawn_with(args, fds[1]);  // dup2 clears O_CLOEXEC on the child's stdout
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return {-1, -1};
  }
  return {pid, fds[0]};
}

std::filesystem::path make_job_directory(const std::string& purpose) {
  const auto dir =
      std::filesystem::temp_directory_path() / fmt::format("ferry-{}-{}", purpose, getpid());
  std::filesystem::create_directories(dir);
  const auto secret_file = dir / "secret";
  {
    std::random_device random;
    std::ofstream out(secret_file, std::ios::binary);
    for (int i = 0; i < 32; ++i) out.put(static_cast<char>(random()));
  }
  std::filesystem::permissions(
      secret_file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  setenv("FERRY_SECRET_FILE", secret_file.c_str(), 1);
  // libfabric loads psm's libinfinipath, whose SIGSEGV handler prints a backtrace and then can hang
  // the process: a crashed child must die at once, so that its peers see the link drop.
  setenv("IPATH_NO_BACKTRACE", "1", 1);
  return dir;
}

std::string wait_for_address(const std::filesystem::path& file, std::chrono::seconds patience) {
  // The coordinator writes the file under another name and renames it: whole or absent.
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (!std::filesystem::exists(file) && std::chrono::steady_clock::now() < deadline) {
    if (!sleep_unless_interrupted(std::chrono::milliseconds(20))) return "";
  }
  std::string address;
  std::ifstream(file) >> address;
  return address;
}

pid_t reap_child(pid_t pid, int& status, int options) {
  siginfo_t ended{};
  // Looks without reaping: once reaped, the pid may be another process's.
  if (waitid(P_PID, static_cast<id_t>(pid), &ended, WEXITED | WNOWAIT | (options & WNOHANG)) != 0)
    return waitpid(pid, &status, options);  // no such child: waitpid's own answer
  if (ended.si_pid == 0) return 0;          // still running
  if (ended.si_code == CLD_KILLED || ended.si_code == CLD_DUMPED) remove_shm_regions_of(pid);
  return waitpid(pid, &status, 0);
}

std::vector<bool> reap(const std::vector<pid_t>& children, std::chrono::milliseconds grace) {
  auto deadline = std::chrono::steady_clock::now() + grace;
  bool passed_on = false;
  std::vector<bool> ok;
  for (std::size_t i = 0; i < children.size(); ++i) {
    const pid_t pid = children[i];
    int raw = 0;
    bool exited = pid > 0;
    while (pid > 0 && reap_child(pid, raw, WNOHANG) == 0) {
      if (interrupt_signal() && !passed_on) {
        // SIGINT or SIGTERM: the children not reaped yet get it too (a node leaves its job, a
        // coordinator stops it), and a short time to act on it.
        passed_on = true;
        for (std::size_t j = i; j < children.size(); ++j) {
          if (children[j] > 0) kill(children[j], interrupt_signal());
        }
        deadline = std::min(deadline, std::chrono::steady_clock::now() + interrupted_grace);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        reap_child(pid, raw, 0);
        exited = false;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ok.push_back(exited && WIFEXITED(raw) && WEXITSTATUS(raw) == 0);
  }
  return ok;
}

line_reader::~line_reader() {
  if (fd_ >= 0) close(fd_);
}

std::optional<std::string> line_reader::next(std::chrono::milliseconds patience) {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  for (;;) {
    if (const auto end = buffered_.find('\n'); end != std::string::npos) {
      std::string line = buffered_.substr(0, end);
      buffered_.erase(0, end + 1);
      return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out_ = true;
      return std::nullopt;
    }
    pollfd p[2] = {{.fd = fd_, .events = POLLIN, .revents = 0},
                   {.fd = stop_fd_, .events = POLLIN, .revents = 0}};
    if (poll(p, stop_fd_ >= 0 ? 2 : 1, static_cast<int>(left.count())) <= 0)
      continue;  // timeout or EINTR: the deadline decides
    if (stop_fd_ >= 0 && p[1].revents != 0) {
      stopped_ = true;
      return std::nullopt;
    }
    char chunk[4096];
    const auto n = read(fd_, chunk, sizeof chunk);
    if (n <= 0) return std::nullopt;
    buffered_.append(chunk, static_cast<std::size_t>(n));
  }
}

std::error_code merge_traces(const std::vector<std::filesystem::path>& parts,
                             const std::string& out) {
  nlohmann::json events = nlohmann::json::array();
  for (const auto& part : parts) {
    std::ifstream in(part);
    if (!in) continue;  // a process that died before writing one
    auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("traceEvents")) continue;
    for (auto& e : j["traceEvents"]) events.push_back(std::move(e));
  }
  std::ofstream file(out);
  file << nlohmann::json{{"displayTimeUnit", "ms"}, {"traceEvents", std::move(events)}}.dump()
       << "\n";
  file.close();
  return file ? std::error_code{} : std::error_code(errno ? errno : EIO, std::generic_category());
}

}  // namespace ferry::cli
