#include "actors/trainer_shard.hpp"

#include <xxhash.h>

#include "runtime/log.hpp"
#include "runtime/node.hpp"
#include "runtime/worker_pool.hpp"

namespace ferry {

trainer_shard::trainer_shard(node& host, actor_id id, address coordinator, std::uint32_t shard,
                             std::vector<tensor_ref> tensors, copy_engine& copies, trainer_options options)
    : actor(host, id),
      coordinator_(coordinator),
      shard_(shard),
      tensors_(std::move(tensors)),
      copies_(copies),
      options_(options) {
  on<plan_ready>([this](const envelope_header&, const plan_ready& m) { adopt_plan(m); });
  on<job_ready>([this](const envelope_header&, const job_ready& m) {
    routes_.clear();
    for (const auto& r : m.routes) {
      route rt{.leader = r.leader, .slots = r.slots, .credits = std::make_unique<slot_counter>(plan_->depth)};
      for (std::uint32_t i = 0; i < plan_->depth; ++i) rt.free.push_back(shard_ * plan_->depth + i);
      routes_.push_back(std::move(rt));
    }
    changed();
    if (on_ready) on_ready();
  });
  on<slot_free>([this](const envelope_header& h, const slot_free& m) {
    for (auto& r : routes_) {
      if (r.leader == h.from) {
        r.free.push_back(m.slot);
        r.credits->release();
      }
    }
  });
  on<version_delivered>([this](const envelope_header&, const version_delivered& m) {
    delivered_ = std::max(delivered_, m.version);
    changed();
    if (on_delivered) on_delivered(m.version, m.verified);
  });
  on<job_failed>([this](const envelope_header&, const job_failed& m) { fail(m.reason); });
  on<job_stop>([this](const envelope_header&, const job_stop&) {
    stopped_ = true;
    changed();
  });
}

trainer_shard::~trainer_shard() {
  stopped_ = true;
  changed();
  for (auto& r : routes_) {
    for (std::uint32_t i = 0; plan_ && i < plan_->depth; ++i) r.credits->release();
  }
  if (running_ > 0) host().loop().run_until([this] { return running_ == 0; });
  if (host_region_) host().transport().deregister_region(host_region_->id);
  if (options_.memory && host_copy_.size() > 0) options_.memory->unpin(host_copy_.span());
}

void trainer_shard::join() {
  register_trainer m{.shard = shard_, .transport_address = host().transport().local_address()};
  for (const auto& t : tensors_) m.tensors.push_back(t.spec);
  start();
  send(coordinator_, m);
}

void trainer_shard::fail(const std::string& reason) {
  if (failed_) return;
  failed_ = true;
  log::error("trainer shard {}: {}", shard_, reason);
  changed();
  for (auto& r : routes_) {
    for (std::uint32_t i = 0; plan_ && i < plan_->depth; ++i) r.credits->release();
  }
  if (on_failed) on_failed(reason);
}

template <class Pred>
bool trainer_shard::wait_for(Pred pred) {
  std::unique_lock lock(state_mutex_);
  state_cv_.wait(lock, [&] { return failed_ || stopped_ || pred(); });
  return !failed_ && !stopped_;
}

void trainer_shard::adopt_plan(const plan_ready& m) {
  for (const auto& p : m.peers) {
    if (p.node != host().id()) host().transport().add_peer(p.node, p.address);
  }
  plan_ = m.plan;
  set_epoch(plan_->epoch);
  local_of_.assign(plan_->tensors.size(), -1);
  stream_offset_.assign(plan_->tensors.size(), 0);
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const int index = plan_->find_tensor(tensors_[i].spec.name);
    if (index >= 0) local_of_[index] = static_cast<int>(i);
  }
  for (const auto& c : plan_->chunks) {
    if (c.shard != shard_) continue;
    for (const auto& p : c.pieces) {
      if (p.tensor_offset == 0) stream_offset_[p.tensor] = c.shard_offset + p.chunk_offset;
    }
  }
  // The host copy is allocated and registered once per plan and reused by every version.
  if (host_copy_.size() != plan_->shard_bytes[shard_]) {
    if (host_region_) host().transport().deregister_region(host_region_->id);
    if (options_.memory && host_copy_.size() > 0) options_.memory->unpin(host_copy_.span());
    host_copy_ = host_buffer(plan_->shard_bytes[shard_]);
    if (options_.memory) {
      if (auto ec = options_.memory->pin(host_copy_.span())) return fail("cannot pin the host copy: " + ec.message());
    }
    auto region = host().transport().register_region(host_copy_.span());
    if (!region) return fail("cannot register the host copy: " + region.error().message());
    host_region_ = *region;
  }
  checksums_.assign(plan_->chunks.size(), 0);
}

result<void> trainer_shard::publish(std::uint64_t version, std::string& why) {
  if (failed_) {
    why = "the job failed";
    return ferry::fail(errc::stopped);
  }
  if (!ready()) {
    why = "the shard is not ready: the plan is not in force yet";
    return ferry::fail(errc::invalid_argument);
  }
  if (version <= last_published_) {
    why = "version " + std::to_string(version) + " is not newer than the last published, " +
          std::to_string(last_published_);
    return ferry::fail(errc::invalid_argument);
  }
  const auto previous = last_published_;
  last_published_ = version;
  ++running_;
  host().loop().spawn([this, version, previous] {
    if (wait_for([&] { return delivered_ >= previous; })) run_publish(version);
    --running_;
  });
  return {};
}

void trainer_shard::run_publish(std::uint64_t version) {
  const auto started = std::chrono::steady_clock::now();
  const auto chunks = plan_->chunks_of(shard_);
  offloaded_chunks_ = 0;
  writes_done_ = 0;
  offload_meter_.reset();
  send_meter_.reset();
  send(coordinator_, publish_started{.shard = shard_, .version = version});

  // The send stage: one fiber per leader, each chunk written as soon as it is offloaded.
  int senders = 0;
  for (auto& r : routes_) {
    ++senders;
    host().loop().spawn([this, &r, version, &chunks, &senders] {
      send_chunks(r, version, chunks);
      --senders;
      changed();
    });
  }

  // The offload stage: tensors into the host copy, chunk by chunk, in send order.
  for (auto id : chunks) {
    const auto& c = plan_->chunks[id];
    std::vector<copy_piece> pieces;
    for (const auto& p : c.pieces) {
      const auto& t = tensors_[local_of_[p.tensor]];
      pieces.push_back({host_copy_.data() + c.shard_offset + p.chunk_offset, t.data + p.tensor_offset, p.bytes});
    }
    offload_meter_.begin();
    auto [ec] = await<std::error_code>([&](auto done) { copies_.async_copy(std::move(pieces), std::move(done)); });
    if (ec) {
      offload_meter_.end();
      fail("offload of chunk " + std::to_string(id) + " failed: " + ec.message());
      break;
    }
    if (options_.checksums) {
      const std::byte* bytes = host_copy_.data() + c.shard_offset;
      worker_pool::shared().run(host().loop(), [&] { checksums_[id] = XXH3_64bits(bytes, c.bytes); });
    }
    offload_meter_.end();
    ++offloaded_chunks_;
    changed();
  }
  if (failed_ || stopped_) {
    std::unique_lock lock(state_mutex_);
    state_cv_.wait(lock, [&] { return senders == 0; });
    return;
  }
  const double stall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  send(coordinator_, shard_offloaded{.shard = shard_, .version = version, .seconds = stall});
  if (on_offloaded) on_offloaded(version, stall);

  {
    std::unique_lock lock(state_mutex_);
    state_cv_.wait(lock, [&] { return senders == 0; });
  }
  if (failed_ || stopped_) return;

  shard_done done{.shard = shard_, .version = version,
                  .busy = {.offload = offload_meter_.seconds(), .send = send_meter_.seconds()}};
  if (options_.digests) {
    worker_pool::shared().run(host().loop(), [&] {
      for (std::uint32_t i = 0; i < plan_->tensors.size(); ++i) {
        if (local_of_[i] < 0 || plan_->owner[i] != shard_) continue;
        const auto h = XXH3_128bits(host_copy_.data() + stream_offset_[i], plan_->tensors[i].nbytes);
        done.digests.push_back({.tensor = i, .low = h.low64, .high = h.high64});
      }
    });
  }
  send(coordinator_, done);
}

void trainer_shard::send_chunks(route& r, std::uint64_t version, const std::vector<std::uint32_t>& chunks) {
  std::size_t in_flight = 0;
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    if (!wait_for([&] { return offloaded_chunks_ > i; })) break;
    r.credits->acquire();
    if (failed_ || stopped_) break;
    const auto slot = r.free.front();
    r.free.pop_front();
    const auto& c = plan_->chunks[chunks[i]];
    const std::span<const std::byte> bytes(host_copy_.data() + c.shard_offset, c.bytes);
    ++in_flight;
    send_meter_.begin();
    host().transport().async_write(
        bytes, r.slots, std::uint64_t{slot} * plan_->chunk_bytes, make_imm(leader_slot_tag, slot),
        [this, &r, &in_flight, version, slot, id = c.id](std::error_code ec) {
          send_meter_.end();
          --in_flight;
          if (ec) {
            fail("write of chunk " + std::to_string(id) + " to node " + std::to_string(r.leader.node) +
                 " failed: " + ec.message());
          } else {
            send(r.leader, chunk_sent{.version = version, .chunk = id, .slot = slot, .checksum = checksums_[id]});
          }
          changed();
        });
  }
  std::unique_lock lock(state_mutex_);
  state_cv_.wait(lock, [&] { return in_flight == 0; });
}

}  // namespace ferry
