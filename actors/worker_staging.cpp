#include "actors/worker_staging.hpp"

#include <algorithm>

#include "actors/member_memory.hpp"
#include "runtime/log.hpp"

namespace ferry {

worker_staging::worker_staging(environment& env, transport& wire, device_memory* memory,
                               std::function<void()> on_settled)
    : env_(env), wire_(wire), memory_(memory), on_settled_(std::move(on_settled)) {}

worker_staging::~worker_staging() {
  *alive_ = false;
  release();
  for (auto* p : retired_device_) memory_->release(p);
  if (broadcast_) memory_->release(broadcast_);
}

void worker_staging::release() {
  if (region_) wire_.deregister_region(region_->id);
  region_.reset();
  if (memory_ && host_.size() > 0) memory_->unpin(host_.span());
  if (host_.size() > 0) retired_host_.push_back(std::move(host_));
  host_ = host_buffer();
  if (device_) retired_device_.push_back(device_);
  device_ = nullptr;
  bytes_ = 0;
}

std::optional<std::string> worker_staging::prepare(const worker_slots& slots,
                                                   std::uint64_t chunk_bytes) {
  const std::size_t broadcast = slots.broadcast;
  bool on_device = slots.receive_on_device;
  chunk_bytes_ = chunk_bytes;
  first_direct_ = slots.first_direct;
  slot_bytes_ = slots.slot_bytes;
  // The broadcast slots first: the receive slots can do without the GPU, they cannot.
  if (broadcast * chunk_bytes > broadcast_bytes_) {
    if (broadcast_) retired_device_.push_back(broadcast_);
    auto taken = memory_->allocate(broadcast * chunk_bytes);
    if (!taken) return "cannot allocate device broadcast slots: " + taken.error().message();
    broadcast_ = *taken;
    broadcast_bytes_ = broadcast * chunk_bytes;
  }
  const std::size_t bytes = slots.receive_bytes(chunk_bytes);
  on_device = on_device && !device_refused_;
  if (bytes > bytes_ || (bytes > 0 && on_device != this->on_device())) {
    auto why = allocate(bytes, on_device);
    if (why && on_device) {  // writes land in host memory from now on, and are uploaded
      log::warn("receive slots in host memory: {}", *why);
      device_refused_ = true;
      why = allocate(bytes, false);
    }
    return why;
  }
  if (region_) rekey();
  return std::nullopt;
}

std::optional<std::string> worker_staging::allocate(std::size_t bytes, bool on_device) {
  release();
  result<region_desc> region;
  std::string why;
  if (on_device) {
    auto slots = memory_->allocate(bytes);
    if (!slots)
      return "cannot allocate the receive slots on GPU " + std::to_string(memory_->device()) +
             ": " + slots.error().message();
    device_ = *slots;
    region = wire_.register_device_region({device_, bytes}, memory_->device(), why);
  } else {
    if (auto refused = beyond_host(env_.platform(), bytes, "the receive slots")) return *refused;
    host_ = env_.platform().host_memory(bytes);
    region = wire_.register_region(host_.span());
    if (region && memory_) {
      if (auto ec = memory_->pin(host_.span()))
        return "cannot pin the receive slots: " + ec.message();
    }
  }
  if (!region)
    return "cannot register the receive slots: " + (why.empty() ? region.error().message() : why);
  region_ = *region;
  bytes_ = bytes;
  return std::nullopt;
}

void worker_staging::rekey() {
  if (auto fresh = wire_.rekey_region(region_->id)) region_ = *fresh;
  const auto rekey = ++rekeys_;
  settled_ = !wire_.when_writes_end(region_->id, [this, alive = alive_, rekey] {
    if (!*alive || rekey != rekeys_) return;
    settled_ = true;
    on_settled_();
  });
}

buffer_ref worker_staging::receive_slot(std::uint32_t slot, std::uint64_t bytes) const {
  const std::uint64_t offset =
      worker_slots::offset_of(slot, first_direct_, slot_bytes_, chunk_bytes_);
  std::byte* base = device_ ? device_ : host_.data();
  bytes = std::min(bytes, slot < first_direct_ ? slot_bytes_ : chunk_bytes_);
  return {.bytes = {base + offset, bytes},
          .region = *region_,
          .offset = offset,
          .device = device_ ? memory_->device() : -1};
}

buffer_ref worker_staging::broadcast_slot(std::uint32_t slot, std::uint64_t bytes) const {
  return {.bytes = {broadcast_ + std::uint64_t{slot} * chunk_bytes_, bytes},
          .device = memory_->device()};
}

}  // namespace ferry
