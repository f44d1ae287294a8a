#pragma once
/// Large host memory for host copies, staging slots and tensors: allocated once, backed by
/// transparent huge pages where the kernel allows, and faulted in up front so no update pays
/// for first touches. (On GPU hosts the CUDA path pins such buffers.) A shareable buffer lives in
/// a memfd that another process on the host can map (`map_shared`), so it reads the bytes in place.
#include <compare>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "runtime/define_map.hpp"
#include "runtime/errc.hpp"

namespace ferry {

/// Names a shareable buffer to other processes of its host: the owner's pid and the fd that holds
/// it (a memfd, or an fd that exports GPU memory: `shared_device_ref`), the fd's inode (which tells
/// it apart from a later one behind a reused pid and fd number), and the owner's `same_host_tag()`
/// (where the pid means that process).
struct shared_memory_ref {
  std::int32_t pid = 0;  ///< 0: none
  std::int32_t fd = -1;
  std::uint64_t inode = 0;
  std::uint64_t host = 0;
  std::uint64_t bytes = 0;
  friend auto operator<=>(const shared_memory_ref&, const shared_memory_ref&) = default;
  FERRY_DEFINE_MAP(pid, fd, inode, host, bytes)
};

/// Move-only owner of one mapping.
class host_buffer {
 public:
  host_buffer() = default;
  /// Maps `bytes` zeroed bytes; throws std::bad_alloc when the mapping fails.
  explicit host_buffer(std::size_t bytes);
  /// Like the constructor, in a memfd that `map_shared` can open from another process.
  static host_buffer shareable(std::size_t bytes);
  /// A size and addresses no one may touch (outside every mapping): a simulated buffer, whose
  /// bytes are modelled and never move. Distinct buffers get disjoint addresses. A `shareable`
  /// one has a `shared_ref` (`simulated_pid`, its first address as the inode) that a simulated
  /// platform maps as another size-only buffer.
  static host_buffer size_only(std::size_t bytes, bool shareable = false);
  /// The pid in the `shared_ref` of a shareable size-only buffer.
  static constexpr std::int32_t simulated_pid = 1;
  /// From now on, buffers in this process (those being made too) fault their pages in on first
  /// touch instead of up front: a process that is stopping need not wait for gigabytes it will
  /// not use. Safe from any thread; there is no way back.
  static void stop_prefaulting();
  /// Maps the shareable buffer `ref` of another process (or this one), read and write; its pages
  /// are faulted in on first touch. Fails with `errc::invalid_argument`, saying why in `why`, when
  /// it lives on another host, the process or its memfd is gone, access is denied, or it is another
  /// memfd or of another size.
  static result<host_buffer> map_shared(const shared_memory_ref& ref, std::string& why);
  ~host_buffer();
  host_buffer(host_buffer&& other) noexcept;
  host_buffer& operator=(host_buffer&& other) noexcept;

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::span<std::byte> span() const { return {data_, size_}; }
  /// How another process maps this buffer; `pid` is 0 unless it is shareable.
  shared_memory_ref shared_ref() const;

 private:
  void release();

  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  int fd_ = -1;  ///< the memfd of a shareable buffer or a mapped one
  std::uint64_t inode_ = 0;
  bool size_only_ = false;
};

}  // namespace ferry
