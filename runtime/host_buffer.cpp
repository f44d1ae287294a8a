#include "runtime/host_buffer.hpp"

#include <sys/mman.h>

#include <new>
#include <utility>

namespace ferry {

host_buffer::host_buffer(std::size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: fine if THP is off
  // Fault every page in now (MAP_POPULATE ignores the huge-page advice).
  data_ = static_cast<std::byte*>(p);
  if (madvise(p, bytes, MADV_POPULATE_WRITE) != 0) {  // kernels before 5.14: touch each page
    for (std::size_t i = 0; i < bytes; i += 4096) data_[i] = std::byte{0};
  }
}

host_buffer::~host_buffer() {
  if (data_) munmap(data_, size_);
}

host_buffer::host_buffer(host_buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

host_buffer& host_buffer::operator=(host_buffer&& other) noexcept {
  if (this != &other) {
    if (data_) munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace ferry
