#include "actors/segment_hasher.hpp"

#include "runtime/await.hpp"
#include "runtime/copy_engine.hpp"

namespace ferry {

segment_hasher::~segment_hasher() {
  if (memory_ && bounce_.size() > 0) memory_->unpin(bounce_.span());
}

result<XXH128_hash_t> segment_hasher::hash(std::span<const std::byte> bytes, bool on_device) {
  const std::byte* host = bytes.data();
  if (on_device) {
    if (bounce_.size() < bytes.size()) {
      if (memory_ && bounce_.size() > 0) memory_->unpin(bounce_.span());
      bounce_ = env_.platform().host_memory(bytes.size());
      // Pinned once and reused; should pinning fail, the copies still work, only slower.
      if (memory_) (void)memory_->pin(bounce_.span());
    }
    auto [ec] = await<std::error_code>([&](auto done) {
      env_.copies().async_copy({{bounce_.data(), bytes.data(), bytes.size()}}, std::move(done));
    });
    if (ec) return fail(ec);
    host = bounce_.data();
  }
  XXH128_hash_t h{};
  env_.cpu().run(bytes.size(), [&] { h = XXH3_128bits(host, bytes.size()); });
  return h;
}

}  // namespace ferry
