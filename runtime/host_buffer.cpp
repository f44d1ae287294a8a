#include "runtime/host_buffer.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/same_host.hpp"

namespace ferry {
namespace {

std::atomic<bool> prefaulting{true};

/// Faults every page of [p, p + bytes) in now, unless `stop_prefaulting` comes first. tmpfs (a
/// memfd) hands out 4 KiB pages one by one at ~1.5 GB/s on one thread, so large buffers are
/// faulted in by several, each in pieces small enough that a stop waits ~50 ms, not seconds.
void populate(std::byte* p, std::size_t bytes) {
  static constexpr std::size_t per_thread = std::size_t{256} << 20;
  static constexpr std::size_t piece = std::size_t{64} << 20;
  auto fault = [](std::byte* from, std::size_t n) {
    for (std::size_t at = 0; at < n && prefaulting.load(std::memory_order_relaxed); at += piece) {
      const auto length = std::min(piece, n - at);
      if (madvise(from + at, length, MADV_POPULATE_WRITE) != 0) {  // kernels before 5.14: touch
        for (std::size_t i = 0; i < length; i += 4096) from[at + i] = std::byte{0};
      }
    }
  };
  const auto threads = std::min<std::size_t>(
      {bytes / per_thread, std::max(1u, std::thread::hardware_concurrency()), 16});
  if (threads < 2) return fault(p, bytes);
  const std::size_t part = (bytes / threads + 4095) / 4096 * 4096;
  std::vector<std::jthread> workers;
  for (std::size_t at = 0; at < bytes; at += part)
    workers.emplace_back(fault, p + at, std::min(part, bytes - at));
}

}  // namespace

host_buffer::host_buffer(std::size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: fine if THP is off
  data_ = static_cast<std::byte*>(p);
  populate(data_, bytes);  // (MAP_POPULATE would ignore the huge-page advice)
}

host_buffer host_buffer::shareable(std::size_t bytes) {
  host_buffer b;
  b.fd_ = memfd_create("ferry-host-copy", MFD_CLOEXEC);
  struct stat st {};
  if (b.fd_ < 0 || ftruncate(b.fd_, static_cast<off_t>(bytes)) != 0 || fstat(b.fd_, &st) != 0)
    throw std::bad_alloc();
  b.inode_ = st.st_ino;
  b.size_ = bytes;
  if (bytes == 0) return b;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, b.fd_, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  b.data_ = static_cast<std::byte*>(p);
  populate(b.data_, bytes);
  return b;
}

void host_buffer::stop_prefaulting() {
  prefaulting.store(false, std::memory_order_relaxed);
}

host_buffer host_buffer::size_only(std::size_t bytes, bool shareable) {
  // Non-canonical x86-64 / AArch64 addresses: a stray touch faults at once instead of reading
  // someone else's memory.
  static std::atomic<std::uint64_t> next{std::uint64_t{1} << 62};
  constexpr std::uint64_t page = 4096;
  host_buffer b;
  b.size_ = bytes;
  b.size_only_ = true;
  b.data_ = reinterpret_cast<std::byte*>(next.fetch_add((bytes + 2 * page - 1) / page * page));
  if (shareable) b.inode_ = reinterpret_cast<std::uint64_t>(b.data_);
  return b;
}

result<host_buffer> host_buffer::map_shared(const shared_memory_ref& ref, std::string& why) {
  if (ref.host != same_host_tag()) {
    why = "process " + std::to_string(ref.pid) +
          " runs on another host, or in another pid or network namespace";
    return fail(errc::invalid_argument);
  }
  // /proc/<pid>/fd/<fd> opens the owner's memfd itself (the kernel checks ptrace-read access).
  const std::string path = "/proc/" + std::to_string(ref.pid) + "/fd/" + std::to_string(ref.fd);
  host_buffer b;
  b.fd_ = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (b.fd_ < 0) {
    why = "cannot open " + path + ": " + std::strerror(errno);
    return fail(errc::invalid_argument);
  }
  struct stat st {};
  if (fstat(b.fd_, &st) != 0 || st.st_ino != ref.inode ||
      static_cast<std::uint64_t>(st.st_size) != ref.bytes) {
    why = path + " is not the " + std::to_string(ref.bytes) + "-byte buffer it was announced as";
    return fail(errc::invalid_argument);
  }
  b.inode_ = st.st_ino;
  b.size_ = ref.bytes;
  if (ref.bytes == 0) return b;
  void* p = mmap(nullptr, ref.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, b.fd_, 0);
  if (p == MAP_FAILED) {
    b.size_ = 0;
    why = "cannot map " + path + ": " + std::strerror(errno);
    return fail(errc::invalid_argument);
  }
  b.data_ = static_cast<std::byte*>(p);
  return b;
}

shared_memory_ref host_buffer::shared_ref() const {
  if (size_only_ && inode_ != 0) return {.pid = simulated_pid, .inode = inode_, .bytes = size_};
  if (fd_ < 0) return {};
  static const std::uint64_t host = same_host_tag();
  return {.pid = static_cast<std::int32_t>(getpid()),
          .fd = fd_,
          .inode = inode_,
          .host = host,
          .bytes = size_};
}

void host_buffer::release() {
  if (data_ && !size_only_) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
  data_ = nullptr;
  size_ = 0;
  fd_ = -1;
  inode_ = 0;
  size_only_ = false;
}

host_buffer::~host_buffer() {
  release();
}

host_buffer::host_buffer(host_buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      fd_(std::exchange(other.fd_, -1)),
      inode_(std::exchange(other.inode_, 0)),
      size_only_(std::exchange(other.size_only_, false)) {}

host_buffer& host_buffer::operator=(host_buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
    inode_ = std::exchange(other.inode_, 0);
    size_only_ = std::exchange(other.size_only_, false);
  }
  return *this;
}

}  // namespace ferry
