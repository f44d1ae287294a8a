#include "transport/region_table.hpp"

#include <random>

namespace ferry {

namespace {

std::uint64_t fresh_key() {
  static thread_local std::mt19937_64 keys{std::random_device{}()};
  return keys();
}

}  // namespace

region_desc region_table::add(std::span<std::byte> memory) {
  std::lock_guard lock(mutex_);
  const auto id = next_id_++;
  const auto key = fresh_key();
  regions_.emplace(id, entry{memory, key});
  return region_desc{.owner = owner_, .id = id, .addr = 0, .key = key, .length = memory.size()};
}

void region_table::remove(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  regions_.erase(id);
}

result<region_desc> region_table::rekey(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  auto it = regions_.find(id);
  if (it == regions_.end()) return fail(transport_errc::unknown_region);
  auto& e = it->second;
  for (const auto old = e.key; e.key == old;) e.key = fresh_key();
  return region_desc{.owner = owner_, .id = id, .addr = 0, .key = e.key, .length = e.memory.size()};
}

result<std::span<std::byte>> region_table::resolve(std::uint64_t id, std::uint64_t key, std::uint64_t offset,
                                                   std::uint64_t length) const {
  std::lock_guard lock(mutex_);
  auto it = regions_.find(id);
  if (it == regions_.end()) return fail(transport_errc::unknown_region);
  if (it->second.key != key) return fail(transport_errc::key_mismatch);
  const auto size = it->second.memory.size();
  if (offset > size || length > size - offset) return fail(transport_errc::out_of_bounds);
  return it->second.memory.subspan(offset, length);
}

bool region_table::contains(std::span<const std::byte> local) const {
  std::lock_guard lock(mutex_);
  for (const auto& [id, e] : regions_) {
    const auto* begin = e.memory.data();
    if (local.data() >= begin && local.data() + local.size() <= begin + e.memory.size()) return true;
  }
  return false;
}

std::size_t region_table::size() const {
  std::lock_guard lock(mutex_);
  return regions_.size();
}

}  // namespace ferry
