#pragma once
/// Launching the processes of a job on this host: spawning, the job directory and its secret,
/// waiting for the coordinator's address, reading a child's output, reaping children.
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

namespace ferry::cli {

/// Starts `args` (argv[0] an executable path) as a child process; returns its pid or -1. The
/// child dies with its launcher, and runs in a process group of its own: a terminal's Ctrl-C
/// reaches the launcher alone, which passes it on (`reap`), so each child sees it once.
pid_t spawn(const std::vector<std::string>& args);

/// Starts `args` with its stdout into a pipe; returns the pid (or -1) and the pipe's read end.
std::pair<pid_t, int> spawn_reading(const std::vector<std::string>& args);

/// A private folder for a launched job, holding a fresh job secret (readable by this user only)
/// that the children find through FERRY_SECRET_FILE, never on their command line. Sets the rest
/// of the children's environment too.
std::filesystem::path make_job_directory(const std::string& purpose);

/// The coordinator's transport address, once it has written `file`; empty after `patience` or
/// once SIGINT or SIGTERM arrived.
std::string wait_for_address(const std::filesystem::path& file, std::chrono::seconds patience);

/// waitpid for a child of this process, which first removes the files of libfabric's shm that a
/// child killed by SIGKILL left (`remove_shm_regions_of`), while its pid is still its own.
pid_t reap_child(pid_t pid, int& status, int options);

/// Waits up to `grace` for each child to exit, then SIGKILLs it. True for a child that exited
/// on its own with status 0. Once SIGINT or SIGTERM arrived (`interrupt_token`), it passes the
/// signal on to the children still running and waits at most `interrupted_grace` more.
std::vector<bool> reap(const std::vector<pid_t>& children, std::chrono::milliseconds grace);

/// The timelines of a job's processes (`--trace`, one file each) as one Chrome trace in `out`
/// (node ids are job-wide, and every process's clock counts from the host's boot). A part that
/// is missing or unreadable (its process was killed) is left out.
std::error_code merge_traces(const std::vector<std::filesystem::path>& parts,
                             const std::string& out);

/// How long an interrupted launcher waits for its children to leave before it SIGKILLs them:
/// within the 2 s a command has to stop.
inline constexpr std::chrono::milliseconds interrupted_grace{1500};

/// Lines from a pipe, with a limit on silence.
class line_reader {
 public:
  /// `stop_fd`, when not -1, ends every wait once it is readable (`interrupt_fd`).
  explicit line_reader(int fd, int stop_fd = -1) : fd_(fd), stop_fd_(stop_fd) {}
  ~line_reader();
  line_reader(const line_reader&) = delete;
  line_reader& operator=(const line_reader&) = delete;

  /// The next line; nothing at the end of the stream, after `patience` without a whole line
  /// (then `timed_out()`), or once `stop_fd` is readable (then `stopped()`).
  std::optional<std::string> next(std::chrono::milliseconds patience);
  bool timed_out() const { return timed_out_; }
  bool stopped() const { return stopped_; }

 private:
  int fd_;
  int stop_fd_;
  bool stopped_ = false;
  std::string buffered_;
  bool timed_out_ = false;
};

}  // namespace ferry::cli
