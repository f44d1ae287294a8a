#include "actors/copy_writes.hpp"

#include <cstring>

namespace ferry {

copy_writes::copy_writes(const plan& job, const tensor_placement& placement,
                         std::span<const std::uint32_t> chunks, std::span<std::byte> copy,
                         std::size_t tensors)
    : copy_(copy), pieces_(tensors), pieces_left_(job.chunks.size(), 0), written_(tensors, false) {
  for (const auto id : chunks) {
    const auto& c = job.chunks[id];
    for (const auto& p : c.pieces) {
      const int local = placement.local_index(p.tensor);
      if (local < 0) continue;  // another shard's (a plan packs each chunk from one shard)
      pieces_[local].push_back({.chunk = id,
                                .tensor_offset = p.tensor_offset,
                                .copy_offset = c.shard_offset + p.chunk_offset,
                                .bytes = p.bytes});
      ++pieces_left_[id];
    }
  }
}

std::optional<std::vector<std::uint32_t>> copy_writes::write(std::size_t index,
                                                             const std::byte* data) {
  if (written_.at(index)) return std::nullopt;
  written_[index] = true;
  std::vector<std::uint32_t> whole;
  for (const auto& p : pieces_[index]) {
    std::memcpy(copy_.data() + p.copy_offset, data + p.tensor_offset, p.bytes);
    if (--pieces_left_[p.chunk] == 0) whole.push_back(p.chunk);
  }
  return whole;
}

}  // namespace ferry
