/// The plain peer of ferry's cma path: one process reads another's memory with a bare loop of
/// process_vm_readv calls (64 MiB each), on 1, 2, 4, 8 and 16 threads, and memcpy inside one
/// process for reference. One JSON line per measurement.
///   cma_peak [GIB]
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

std::byte* map_touched(std::size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::exit(1);
  madvise(p, bytes, MADV_HUGEPAGE);  // as ferry's host_buffer
  auto* b = static_cast<std::byte*>(p);
  for (std::size_t i = 0; i < bytes; i += 4096) b[i] = static_cast<std::byte>(i >> 12);
  return b;
}

/// GB/s of `threads` threads each running `part(begin, end)` over an equal share of `bytes`.
template <class Part>
double timed(std::size_t bytes, unsigned threads, Part part) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back(part, bytes / threads * t, bytes / threads * (t + 1));
  for (auto& th : pool) th.join();
  return static_cast<double>(bytes) /
         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t bytes = (argc > 1 ? std::stoull(argv[1]) : 4) << 30;
  std::byte* source = map_touched(bytes);
  int ready[2];
  if (pipe(ready) != 0) return 1;
  const pid_t owner = fork();
  if (owner == 0) {  // holds `source` while a sibling reads it; Yama may require the permission
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY);
    if (write(ready[1], "r", 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char c;
  if (read(ready[0], &c, 1) != 1) return 1;
  const pid_t reader = fork();
  if (reader == 0) {
    std::byte* target = map_touched(bytes);
    for (unsigned threads : {1u, 2u, 4u, 8u, 16u}) {
      bool ok = true;
      const double gbps = timed(bytes, threads, [&](std::size_t begin, std::size_t end) {
        for (std::size_t at = begin; at < end;) {
          const std::size_t n = std::min<std::size_t>(end - at, 64u << 20);
          iovec local{target + at, n}, remote{source + at, n};
          const ssize_t got = process_vm_readv(owner, &local, 1, &remote, 1, 0);
          if (got <= 0) {
            ok = false;
            return;
          }
          at += static_cast<std::size_t>(got);
        }
      });
      ok = ok && std::memcmp(target, source, bytes) == 0;
      std::printf(
          "{\"path\":\"process_vm_readv\",\"threads\":%u,\"gbps\":%.2f,\"bytes_match\":%s}\n",
          threads, gbps, ok ? "true" : "false");
    }
    for (unsigned threads : {1u, 8u, 16u}) {
      const double gbps = timed(bytes, threads, [&](std::size_t begin, std::size_t end) {
        std::memcpy(target + begin, source + begin, end - begin);
      });
      std::printf("{\"path\":\"memcpy\",\"threads\":%u,\"gbps\":%.2f}\n", threads, gbps);
    }
    std::fflush(stdout);
    _exit(0);
  }
  int status = 0;
  waitpid(reader, &status, 0);
  kill(owner, SIGKILL);
  waitpid(owner, nullptr, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
