#pragma once
/// Large host memory for host copies, staging slots and tensors: allocated once, backed by
/// transparent huge pages where the kernel allows, and faulted in up front so no update pays
/// for first touches. (On GPU hosts the CUDA path pins such buffers.)
#include <cstddef>
#include <span>

namespace ferry {

/// Move-only owner of one mapping.
class host_buffer {
 public:
  host_buffer() = default;
  /// Maps `bytes` zeroed bytes; throws std::bad_alloc when the mapping fails.
  explicit host_buffer(std::size_t bytes);
  ~host_buffer();
  host_buffer(host_buffer&& other) noexcept;
  host_buffer& operator=(host_buffer&& other) noexcept;

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::span<std::byte> span() const { return {data_, size_}; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace ferry
