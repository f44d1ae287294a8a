#pragma once
/// A GPU for virtual time, so that device-direct runs with real bytes where no GPU is: its memory
/// is host memory; its shared memory is kept alive by reference counts, as CUDA VMM's physical
/// memory is (a mapping outlives its owner), and another virtual device of the same host whose
/// GPU reads the owner's maps it to the same bytes. Shared buffers name the owner's pid: once the
/// virtual environment ends that process they can no longer be mapped, as pidfd_getfd fails then.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/device_memory.hpp"
#include "runtime/environment.hpp"
#include "runtime/host_buffer.hpp"

namespace ferry::testing {

/// The shared buffers every virtual device of a test exported, by the fd their refs name.
struct virtual_shared_memory {
  struct exported_buffer {
    std::weak_ptr<host_buffer> bytes;
    std::string gpu;  ///< where it lives
  };
  std::map<std::int32_t, exported_buffer> exported;
  std::int32_t next_fd = 100;
  int maps = 0;  ///< mappings made
  /// Buffers whose memory some owner or mapping still holds.
  std::size_t alive() const {
    return std::count_if(exported.begin(), exported.end(),
                         [](const auto& e) { return !e.second.bytes.expired(); });
  }
};

/// Owning loop only.
class virtual_device final : public device_memory {
 public:
  /// Device `device` of process `pid` on host `host_tag`: GPU `gpu`, reading the GPUs `reads`
  /// directly (its own included).
  virtual_device(environment& env, virtual_shared_memory& shared, int device, std::int32_t pid,
                 std::string gpu, std::vector<std::string> reads, std::uint64_t host_tag = 7)
      : env_(env),
        shared_(shared),
        device_(device),
        pid_(pid),
        place_{.host = host_tag, .gpu = std::move(gpu), .reads = std::move(reads)} {}

  int device() const override { return device_; }
  result<std::byte*> allocate(std::size_t bytes) override {
    if (allocated + bytes > capacity) return fail(errc::invalid_argument);  // out of memory
    allocated += bytes;
    owned_.emplace_back(bytes);
    return owned_.back().data();
  }
  void release(std::byte*) override {}
  std::error_code pin(std::span<std::byte>) override { return {}; }
  void unpin(std::span<std::byte>) override {}
  device_place place() const override { return place_; }

  std::size_t allocated = 0;        ///< by `allocate`: staging, not shared memory
  std::size_t capacity = SIZE_MAX;  ///< what `allocate` hands out at most

  result<std::unique_ptr<shared_device_buffer>> allocate_shared(std::size_t bytes,
                                                                std::string&) override {
    auto held = std::make_shared<host_buffer>(bytes);
    const auto fd = shared_.next_fd++;
    shared_.exported[fd] = {.bytes = held, .gpu = place_.gpu};
    return std::make_unique<buffer>(held, shared_device_ref{.pid = pid_,
                                                            .fd = fd,
                                                            .inode = std::uint64_t(fd),
                                                            .host = place_.host,
                                                            .bytes = bytes});
  }

  result<std::unique_ptr<shared_device_buffer>> map_shared(const shared_device_ref& ref,
                                                           std::string& why) override {
    const auto it = shared_.exported.find(ref.fd);
    auto held = it == shared_.exported.end() ? nullptr : it->second.bytes.lock();
    if (ref.host != place_.host || !env_.platform().process_alive(ref.pid) || !held) {
      why = "process " + std::to_string(ref.pid) + " is gone or on another host";
      return fail(errc::invalid_argument);
    }
    if (std::find(place_.reads.begin(), place_.reads.end(), it->second.gpu) == place_.reads.end()) {
      why = "cuMemSetAccess: GPU " + place_.gpu + " has no peer access to GPU " + it->second.gpu;
      return fail(errc::invalid_argument);
    }
    ++shared_.maps;
    return std::make_unique<buffer>(std::move(held), shared_device_ref{});
  }

 private:
  class buffer final : public shared_device_buffer {
   public:
    buffer(std::shared_ptr<host_buffer> held, shared_device_ref ref)
        : held_(std::move(held)), ref_(ref) {}
    std::span<std::byte> bytes() const override { return held_->span(); }
    shared_device_ref ref() const override { return ref_; }

   private:
    std::shared_ptr<host_buffer> held_;
    shared_device_ref ref_;
  };

  environment& env_;
  virtual_shared_memory& shared_;
  int device_;
  std::int32_t pid_;
  device_place place_;
  std::vector<host_buffer> owned_;
};

}  // namespace ferry::testing
