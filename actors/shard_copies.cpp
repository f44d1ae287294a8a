#include "actors/shard_copies.hpp"

#include "actors/member_memory.hpp"

namespace ferry {

shard_copies::~shard_copies() {
  release_host();
  release_device();
}

void shard_copies::release_host() {
  if (host_region_) wire_.deregister_region(host_region_->id);
  host_region_.reset();
  if (memory_ && host_.size() > 0) memory_->unpin(host_.span());
  if (host_.size() > 0) retired_host_.push_back(std::move(host_));
  host_ = host_buffer();
}

void shard_copies::release_device() {
  if (device_region_) wire_.deregister_region(device_region_->id);
  device_region_.reset();
  if (device_) retired_device_.push_back(std::move(device_));
}

std::optional<std::string> shard_copies::prepare(std::uint64_t bytes, plan::shard_copies kept,
                                                 bool shareable) {
  if (bytes != bytes_) {  // another layout: nothing held is sendable any more
    release_host();
    release_device();
    copies_ = {};
    bytes_ = bytes;
  }
  kept_ = kept;
  const bool host_fits = host_.size() > 0 && (host_.shared_ref().pid != 0) == shareable;
  if (kept.host && !host_fits && bytes > 0) {
    release_host();
    if (auto why = beyond_host(env_.platform(), 2 * bytes, "the host copies")) return *why;
    host_ = env_.platform().host_memory(2 * bytes, shareable);
    if (memory_) {
      if (auto ec = memory_->pin(host_.span()))
        return "cannot pin the host copies: " + ec.message();
    }
    auto region = wire_.register_region(host_.span());
    if (!region) return "cannot register the host copies: " + region.error().message();
    host_region_ = *region;
    for (auto& c : copies_)
      c.in_host.assign(c.in_host.size(), false);  // new memory holds nothing yet
  }
  if (kept.device && !device_ && bytes > 0) {
    if (!memory_) return "device copies need the shard's tensors on a GPU";
    std::string why;
    auto shared = memory_->allocate_shared(2 * bytes, why);
    if (!shared)
      return "cannot allocate the device copies (" + std::to_string(2 * bytes) + " bytes): " + why;
    device_ = std::move(*shared);
  }
  if (kept.device_written && device_ && !device_region_) {
    std::string why;
    auto region = wire_.register_device_region(device_->bytes(), memory_->device(), why);
    if (!region) return "cannot register the device copies for GPUDirect writes: " + why;
    device_region_ = *region;
  }
  for (std::size_t i = 0; i < copies_.size(); ++i) {
    auto& c = copies_[i];
    c.offset = i * bytes;
    c.host = host_.size() > 0 ? host_.span().subspan(c.offset, bytes) : std::span<std::byte>{};
    c.device = device_ ? device_->bytes().subspan(c.offset, bytes) : std::span<std::byte>{};
  }
  return std::nullopt;
}

shard_copies::version_copy* shard_copies::holding(std::uint64_t version) {
  auto& c = for_version(version);
  return c.version == version ? &c : nullptr;
}

std::vector<shard_copies::version_copy*> shard_copies::missing_from_host() {
  std::vector<version_copy*> missing;
  for (auto& c : copies_) {
    if (c.version == 0 || c.host.empty()) continue;
    for (std::size_t id = 0; id < c.in_device.size(); ++id) {
      if (c.in_device[id] && !c.in_host.at(id)) {
        missing.push_back(&c);
        break;
      }
    }
  }
  return missing;
}

}  // namespace ferry
