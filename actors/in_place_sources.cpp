#include "actors/in_place_sources.hpp"

#include "runtime/await.hpp"
#include "runtime/log.hpp"

namespace ferry {

mapped_source::~mapped_source() {
  if (pinned) pinned->unpin(host.span());
}

result<in_place_sources::chunk_bytes> in_place_sources::chunk(const chunk_sent& m,
                                                              std::uint64_t bytes,
                                                              std::string& why) {
  const bool on_device = m.device_source.pid != 0;
  auto copy = on_device ? device_copies(m.device_source, why) : host_copy(m.source, why);
  if (!copy) {
    const auto owner = on_device ? m.device_source.pid : m.source.pid;
    return fail(env_.platform().process_alive(owner) ? errc::invalid_argument : errc::stopped);
  }
  const auto all = copy->bytes();
  if (m.source_offset > all.size() || bytes > all.size() - m.source_offset) {
    why = "chunk " + std::to_string(m.chunk) + " lies past the end of its trainer's " +
          (on_device ? "device copies" : "host copy");
    return fail(errc::invalid_argument);
  }
  return chunk_bytes{.copy = std::move(copy),
                     .bytes = all.subspan(m.source_offset, bytes),
                     .on_device = on_device};
}

void in_place_sources::forget_dead() {
  auto dead = [this](const auto& s) { return !env_.platform().process_alive(s.first.pid); };
  std::erase_if(host_, dead);
  std::erase_if(device_, dead);
}

std::shared_ptr<const mapped_source> in_place_sources::host_copy(const shared_memory_ref& ref,
                                                                 std::string& why) {
  if (auto it = host_.find(ref); it != host_.end()) return it->second;
  auto mapped = env_.platform().map_shared(ref, why);
  if (!mapped) {
    why =
        "cannot read a trainer's host copy in place (every trainer and leader must share one "
        "host): " +
        why;
    return nullptr;
  }
  auto copy = std::make_shared<mapped_source>();
  copy->host = std::move(*mapped);
  if (memory_ && memory_->device() >= 0) {
    auto [pinned] = await<std::error_code>([&](auto done) {
      env_.platform().async_blocking(
          [memory = memory_, bytes = copy->host.span()] { return memory->pin(bytes); },
          std::move(done));
    });
    if (pinned) {
      why = "cannot pin a trainer's host copy: " + pinned.message();
      return nullptr;
    }
    copy->pinned = memory_;
  }
  if (auto it = host_.find(ref); it != host_.end()) return it->second;  // mapped meanwhile
  log::info("{}: reads the host copy of trainer process {} in place ({} MiB)", owner_, ref.pid,
            ref.bytes >> 20);
  host_.emplace(ref, copy);
  return copy;
}

std::shared_ptr<const mapped_source> in_place_sources::device_copies(const shared_device_ref& ref,
                                                                     std::string& why) {
  if (auto it = device_.find(ref); it != device_.end()) return it->second;
  if (!memory_ || memory_->device() < 0) {
    why = "a trainer sent its device copies, but this worker's tensors are not on a GPU";
    return nullptr;
  }
  auto mapped = memory_->map_shared(ref, why);
  if (!mapped) {
    why = "cannot map the device copies of trainer process " + std::to_string(ref.pid) +
          " on GPU " + std::to_string(memory_->device()) +
          " (--p2p host sends through host memory instead): " + why;
    return nullptr;
  }
  auto copy = std::make_shared<mapped_source>();
  copy->device = std::move(*mapped);
  log::info("{}: reads the device copies of trainer process {} GPU to GPU ({} MiB)", owner_,
            ref.pid, ref.bytes >> 20);
  device_.emplace(ref, copy);
  return copy;
}

}  // namespace ferry
