#include "actors/stages.hpp"

#include <xxhash.h>

#include "runtime/await.hpp"
#include "runtime/copy_engine.hpp"
#include "runtime/event_loop.hpp"
#include "runtime/shared_per_sources.hpp"

namespace ferry {

tensor_placement::tensor_placement(const plan_index& job, std::span<const tensor_ref> local,
                                   std::optional<std::uint32_t> owned_by)
    : local_of_(job.job().tensors.size(), -1) {
  const auto& owner = job.job().owner;
  places_.reserve(local.size());
  for (std::size_t i = 0; i < local.size(); ++i) {
    places_.push_back({.data = local[i].data, .first = local[i].held().offset});
    const auto t = job.tensor_named(local[i].spec.name);
    if (t < 0 || local_of_[t] >= 0) continue;
    if (owned_by && (static_cast<std::size_t>(t) >= owner.size() || owner[t] != *owned_by))
      continue;
    local_of_[t] = static_cast<int>(i);
  }
}

std::shared_ptr<const tensor_placement> tensor_placement::shared(
    const std::shared_ptr<const plan_index>& job,
    const std::shared_ptr<const std::vector<tensor_ref>>& local) {
  return shared_per_sources<tensor_placement>(
      [&] { return std::make_shared<const tensor_placement>(*job, *local); }, job, local);
}

void async_chunk_checksum(environment& env, std::span<const std::byte> bytes,
                          std::function<void(std::uint64_t)> done) {
  auto sum = std::make_shared<std::uint64_t>();
  env.cpu().async_run(
      bytes.size(), [bytes, sum] { *sum = XXH3_64bits(bytes.data(), bytes.size()); },
      [sum, done = std::move(done)] { done(*sum); });
}

std::uint64_t chunk_checksum(environment& env, std::span<const std::byte> bytes) {
  auto [sum] =
      await<std::uint64_t>([&](auto done) { async_chunk_checksum(env, bytes, std::move(done)); });
  return sum;
}

namespace {

/// What an offload hashes: the chunk it wrote, unless told not to.
std::span<const std::byte> hashed_if(bool hash, const std::byte* chunk, std::uint64_t bytes) {
  return hash ? std::span<const std::byte>(chunk, bytes) : std::span<const std::byte>{};
}

}  // namespace

offload_stage::outcome offload_stage::run(const chunk_info& c,
                                          std::span<const std::byte> copy_of_stream,
                                          std::span<std::byte> stream, std::uint64_t version,
                                          const std::function<bool()>& wanted, bool hash) {
  std::byte* const at = stream.data() + c.shard_offset;
  return copy(c, {{at, copy_of_stream.data() + c.shard_offset, c.bytes}}, version, wanted,
              hashed_if(hash, at, c.bytes));
}

void offload_stage::async_run(const chunk_info& c, const tensor_placement& from,
                              std::span<std::byte> stream, std::uint64_t version,
                              std::function<bool()> wanted, bool hash,
                              std::function<void(outcome)> done) {
  std::vector<copy_piece> pieces;
  pieces.reserve(c.pieces.size());
  std::byte* const at = stream.data() + c.shard_offset;
  for (const auto& p : c.pieces)
    pieces.push_back({at + p.chunk_offset, from.at(p.tensor, p.tensor_offset), p.bytes});
  const auto began = meter_.begin();
  auto finish = [this, began, version, chunk = c.id, bytes = c.bytes, done](outcome out) {
    meter_.end(began, version, chunk, bytes);
    done(out);
  };
  env_.copies().async_copy(
      std::move(pieces), [this, hashed = hashed_if(hash, at, c.bytes), wanted = std::move(wanted),
                          finish = std::move(finish)](std::error_code ec) {
        outcome out{.error = ec, .abandoned = !wanted()};
        if (ec || out.abandoned || !checksums_ || hashed.empty()) return finish(out);
        async_chunk_checksum(env_, hashed, [wanted, finish, out](std::uint64_t sum) mutable {
          out.checksum = sum;
          out.abandoned = !wanted();
          finish(out);
        });
      });
}

void offload_stage::async_hash(const chunk_info& c, std::span<const std::byte> stream,
                               std::uint64_t version, std::function<bool()> wanted,
                               std::function<void(outcome)> done) {
  const auto began = meter_.begin();
  auto finish = [this, began, version, chunk = c.id, bytes = c.bytes, wanted = std::move(wanted),
                 done = std::move(done)](std::uint64_t sum) {
    meter_.end(began, version, chunk, bytes);
    done({.abandoned = !wanted(), .checksum = sum});
  };
  if (!checksums_) return env_.loop().post([finish = std::move(finish)] { finish(0); });
  async_chunk_checksum(env_, stream.subspan(c.shard_offset, c.bytes), std::move(finish));
}

offload_stage::outcome offload_stage::copy(const chunk_info& c, std::vector<copy_piece> pieces,
                                           std::uint64_t version,
                                           const std::function<bool()>& wanted,
                                           std::span<const std::byte> hashed) {
  const auto began = meter_.begin();
  outcome out;
  auto [ec] = await<std::error_code>(
      [&](auto done) { env_.copies().async_copy(std::move(pieces), std::move(done)); });
  if (!wanted()) {
    out.abandoned = true;
  } else if (ec) {
    out.error = ec;
  } else if (checksums_ && !hashed.empty()) {
    out.checksum = chunk_checksum(env_, hashed);
    out.abandoned = !wanted();
  }
  meter_.end(began, version, c.id, c.bytes);
  return out;
}

void send_stage::write(std::span<const std::byte> bytes, const region_desc& to,
                       std::uint64_t offset, write_imm imm, std::uint64_t version,
                       std::uint32_t chunk, std::function<void(std::error_code)> done) {
  const auto began = meter_.begin();
  wire_.async_write(
      bytes, to, offset, imm,
      [this, began, version, chunk, n = bytes.size(), done = std::move(done)](std::error_code ec) {
        meter_.end(began, version, chunk, n);
        done(ec);
      });
}

void apply_stage::run(const chunk_info& c, const tensor_placement& into,
                      std::span<const std::byte> bytes, std::uint64_t version,
                      std::function<void(std::error_code)> done) {
  std::vector<copy_piece> pieces;
  pieces.reserve(c.pieces.size());
  for (const auto& p : c.pieces)
    pieces.push_back({into.at(p.tensor, p.tensor_offset), bytes.data() + p.chunk_offset, p.bytes});
  const auto began = meter_.begin();
  env_.copies().async_copy(std::move(pieces), [this, began, version, chunk = c.id, n = bytes.size(),
                                               done = std::move(done)](std::error_code ec) {
    meter_.end(began, version, chunk, n);
    done(ec);
  });
}

}  // namespace ferry
