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
  std::vector<std::function<void()>> ended;
  {
    std::unique_lock lock(mutex_);
    auto it = regions_.find(id);
    if (it == regions_.end()) return;
    ended = std::move(it->second.when_ended);
    regions_.erase(it);
    landed_.wait(lock, [&] { return !landing_.contains(id); });  // a memcpy: milliseconds
  }
  for (auto& done : ended) done();  // its writes are counted no more
}

result<region_desc> region_table::rekey(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  auto it = regions_.find(id);
  if (it == regions_.end()) return fail(transport_errc::unknown_region);
  auto& e = it->second;
  for (const auto old = e.key; e.key == old;) e.key = fresh_key();
  return region_desc{.owner = owner_, .id = id, .addr = 0, .key = e.key, .length = e.memory.size()};
}

result<std::span<std::byte>> region_table::resolve(std::uint64_t id, std::uint64_t key,
                                                   std::uint64_t offset,
                                                   std::uint64_t length) const {
  std::lock_guard lock(mutex_);
  return check(id, key, offset, length);
}

result<std::span<std::byte>> region_table::check(std::uint64_t id, std::uint64_t key,
                                                 std::uint64_t offset, std::uint64_t length) const {
  auto it = regions_.find(id);
  if (it == regions_.end()) return fail(transport_errc::unknown_region);
  if (it->second.key != key) return fail(transport_errc::key_mismatch);
  const auto size = it->second.memory.size();
  if (offset > size || length > size - offset) return fail(transport_errc::out_of_bounds);
  return it->second.memory.subspan(offset, length);
}

result<std::span<std::byte>> region_table::begin_write(std::uint64_t id, std::uint64_t key,
                                                       std::uint64_t offset, std::uint64_t length) {
  std::lock_guard lock(mutex_);
  auto target = check(id, key, offset, length);
  if (target)
    ++regions_.at(id).writing;  // with the check, so that a rekey comes before or after both
  return target;
}

void region_table::end_write(std::uint64_t id) {
  std::vector<std::function<void()>> ended;
  {
    std::lock_guard lock(mutex_);
    auto it = regions_.find(id);
    if (it == regions_.end() || it->second.writing == 0 || --it->second.writing > 0) return;
    ended = std::move(it->second.when_ended);
    it->second.when_ended.clear();
  }
  for (auto& done : ended) done();
}

bool region_table::land(std::uint64_t id, const std::function<void()>& copy) {
  {
    std::lock_guard lock(mutex_);
    if (!regions_.contains(id)) return false;
    ++landing_[id];
  }
  copy();
  std::lock_guard lock(mutex_);
  if (const auto it = landing_.find(id); --it->second == 0) {
    landing_.erase(it);
    landed_.notify_all();
  }
  return true;
}

bool region_table::when_writes_end(std::uint64_t id, std::function<void()> done) {
  std::lock_guard lock(mutex_);
  auto it = regions_.find(id);
  if (it == regions_.end() || it->second.writing == 0) return false;
  it->second.when_ended.push_back(std::move(done));
  return true;
}

bool region_table::contains(std::span<const std::byte> local) const {
  std::lock_guard lock(mutex_);
  for (const auto& [id, e] : regions_) {
    const auto* begin = e.memory.data();
    if (local.data() >= begin && local.data() + local.size() <= begin + e.memory.size())
      return true;
  }
  return false;
}

std::size_t region_table::size() const {
  std::lock_guard lock(mutex_);
  return regions_.size();
}

}  // namespace ferry
