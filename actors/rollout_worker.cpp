#include "actors/rollout_worker.hpp"

#include <xxhash.h>

#include <algorithm>

#include "collectives/host/chain_broadcast.hpp"
#include "runtime/log.hpp"
#include "runtime/node.hpp"
#include "runtime/worker_pool.hpp"

namespace ferry {

rollout_worker::rollout_worker(node& host, actor_id id, address coordinator, std::uint32_t instance,
                               std::uint32_t rank, std::vector<tensor_ref> tensors, copy_engine& copies,
                               worker_options options)
    : actor(host, id),
      coordinator_(coordinator),
      instance_(instance),
      rank_(rank),
      tensors_(std::move(tensors)),
      copies_(copies),
      options_(options) {
  for (auto& t : tensors_) {
    if (t.data) continue;
    owned_.emplace_back(t.spec.nbytes);
    t.data = owned_.back().data();
  }
  on<plan_ready>([this](const envelope_header&, const plan_ready& m) { adopt_plan(m); });
  on<chunk_sent>([this](const envelope_header&, const chunk_sent& m) { on_chunk_sent(m); });
  on<chunk_announce>([this](const envelope_header&, const chunk_announce& m) {
    announcements_.push_back(m);
    changed();
  });
  on<job_failed>([this](const envelope_header&, const job_failed& m) { fail(m.reason); });
  on<job_stop>([this](const envelope_header&, const job_stop&) {
    stopped_ = true;
    changed();
  });
}

rollout_worker::~rollout_worker() {
  stopped_ = true;
  changed();
  if (broadcast_credits_) broadcast_credits_->release();
  if (broadcast_) broadcast_->abort();
  if (fibers_ > 0 || in_flight_ > 0) host().loop().run_until([this] { return fibers_ == 0 && in_flight_ == 0; });
  broadcast_.reset();
  host().forget_writes(leader_slot_tag);
  if (slots_region_) host().transport().deregister_region(slots_region_->id);
  if (on_device() && slots_.size() > 0) options_.memory->unpin(slots_.span());
  if (device_slots_) options_.memory->release(device_slots_);
}

void rollout_worker::join() {
  register_worker m{.instance = instance_, .rank = rank_, .transport_address = host().transport().local_address()};
  for (const auto& t : tensors_) m.tensors.push_back(t.spec);
  start();
  send(coordinator_, m);
}

void rollout_worker::fail(const std::string& reason) {
  if (failed_) return;
  failed_ = true;
  log::error("worker {}.{}: {}", instance_, rank_, reason);
  changed();
  if (broadcast_credits_) broadcast_credits_->release();
  if (on_failed) on_failed(reason);
}

template <class Pred>
bool rollout_worker::wait_for(Pred pred) {
  std::unique_lock lock(state_mutex_);
  state_cv_.wait(lock, [&] { return failed_ || stopped_ || pred(); });
  return !failed_ && !stopped_;
}

void rollout_worker::adopt_plan(const plan_ready& m) {
  for (const auto& p : m.peers) {
    if (p.node != host().id()) host().transport().add_peer(p.node, p.address);
  }
  plan_ = m.plan;
  set_epoch(plan_->epoch);
  local_of_.assign(plan_->tensors.size(), -1);
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const int index = plan_->find_tensor(tensors_[i].spec.name);
    if (index >= 0) local_of_[index] = static_cast<int>(i);
  }
  const auto& inst = plan_->instances.at(instance_);
  leader_ = std::find(inst.leaders.begin(), inst.leaders.end(), rank_) != inst.leaders.end();
  followers_.clear();
  for (std::uint32_t r = 0; r < inst.workers.size(); ++r) {
    if (r != rank_) followers_.push_back(inst.workers[r]);
  }

  // Staging is allocated once per plan: a leader has `depth` receive slots per trainer shard in
  // host memory; every member has `depth` broadcast slots, on the device when there is one
  // (a host leader broadcasts straight from its receive slots and needs none).
  const std::size_t host_slots = leader_ ? plan_->shards.size() * plan_->depth : (on_device() ? 0 : plan_->depth);
  if (host_slots > 0) {
    slots_ = host_buffer(host_slots * plan_->chunk_bytes);
    auto region = host().transport().register_region(slots_.span());
    if (!region) return fail("cannot register staging slots: " + region.error().message());
    slots_region_ = *region;
    if (on_device()) {
      if (auto ec = options_.memory->pin(slots_.span())) return fail("cannot pin the receive slots: " + ec.message());
    }
  }
  if (on_device()) {
    auto slots = options_.memory->allocate(std::size_t{plan_->depth} * plan_->chunk_bytes);
    if (!slots) return fail("cannot allocate device broadcast slots: " + slots.error().message());
    device_slots_ = *slots;
  }
  free_slots_.clear();
  for (std::uint32_t i = 0; i < plan_->depth; ++i) free_slots_.push_back(i);
  broadcast_credits_ = std::make_unique<slot_counter>(plan_->depth);
  broadcast_ = options_.make_broadcast ? options_.make_broadcast(*this, inst.workers, plan_->epoch)
                                       : std::make_unique<chain_broadcast>(*this, inst.workers, plan_->epoch, chain_tag);

  ++fibers_;
  if (leader_) {
    host().on_write(leader_slot_tag, [this](const write_notice& n) { on_slot_landed(imm_value(n.imm)); });
    host().loop().spawn([this] {
      lead();
      --fibers_;
    });
  } else {
    host().loop().spawn([this] {
      follow();
      --fibers_;
    });
  }
  send(coordinator_, worker_ready{.instance = instance_, .rank = rank_,
                                  .slots = leader_ ? *slots_region_ : region_desc{}});
}

void rollout_worker::on_slot_landed(std::uint32_t slot) {
  landed_[slot] = true;
  if (auto it = announced_.find(slot); it != announced_.end()) {
    ready_.push_back({slot, it->second});
    announced_.erase(it);
    landed_.erase(slot);
    changed();
  }
}

void rollout_worker::on_chunk_sent(const chunk_sent& m) {
  if (!leader_ || m.slot >= plan_->shards.size() * plan_->depth) {
    return fail("chunk_sent for slot " + std::to_string(m.slot) + ", which this worker does not have");
  }
  announced_[m.slot] = m;
  if (landed_.erase(m.slot) > 0) {
    ready_.push_back({m.slot, m});
    announced_.erase(m.slot);
    changed();
  }
}

bool rollout_worker::checksum_ok(std::span<const std::byte> bytes, std::uint64_t expected) {
  if (!options_.checksums || expected == 0) return true;
  std::uint64_t actual = 0;
  worker_pool::shared().run(host().loop(), [&] { actual = XXH3_64bits(bytes.data(), bytes.size()); });
  return actual == expected;
}

void rollout_worker::lead() {
  for (;;) {
    if (!wait_for([&] { return !ready_.empty(); })) return;
    broadcast_credits_->acquire();
    if (failed_ || stopped_) return;
    const received r = ready_.front();
    ready_.pop_front();
    const auto& c = plan_->chunks.at(r.meta.chunk);
    const std::span<std::byte> bytes(slots_.data() + std::size_t{r.slot} * plan_->chunk_bytes, c.bytes);
    if (!checksum_ok(bytes, r.meta.checksum)) {
      const auto reason = "leader " + std::to_string(instance_) + "." + std::to_string(rank_) +
                          ": checksum mismatch in chunk " + std::to_string(c.id) + " of version " +
                          std::to_string(r.meta.version) + " from trainer shard " + std::to_string(c.shard) +
                          " (node " + std::to_string(plan_->shards.at(c.shard).node) + ")";
      send(coordinator_, participant_error{.reason = reason});
      fail(reason);
      return;
    }
    for (const auto& f : followers_) {
      send(f, chunk_announce{.version = r.meta.version, .chunk = c.id, .checksum = r.meta.checksum});
    }
    const auto shard = plan_->shards.at(c.shard);
    const auto version = r.meta.version;
    ++in_flight_;
    if (!on_device()) {
      // The receive slot is the broadcast's source; it is free once broadcast and apply are done.
      spread(version, c.id,
             buffer_ref{.bytes = bytes, .region = *slots_region_, .offset = std::uint64_t{r.slot} * plan_->chunk_bytes},
             [this, shard, r] {
               send(shard, slot_free{.slot = r.slot});
               broadcast_credits_->release();
               chunk_applied(r.meta.version, r.meta.chunk);
               --in_flight_;
               changed();
             });
      continue;
    }
    // UPLOAD: the receive slot is free as soon as its bytes are on the device.
    const auto dslot = free_slots_.front();
    free_slots_.pop_front();
    const buffer_ref target = broadcast_slot(dslot, c.bytes);
    upload_meter_.begin();
    copies_.async_copy({{target.bytes.data(), bytes.data(), c.bytes}}, [=, this](std::error_code ec) {
      upload_meter_.end();
      send(shard, slot_free{.slot = r.slot});
      if (ec) fail("upload of chunk " + std::to_string(c.id) + " failed: " + ec.message());
      spread(version, c.id, target, [this, dslot, r] {
        free_slots_.push_back(dslot);
        broadcast_credits_->release();
        chunk_applied(r.meta.version, r.meta.chunk);
        --in_flight_;
        changed();
      });
    });
  }
}

void rollout_worker::spread(std::uint64_t version, std::uint32_t chunk, buffer_ref source, std::function<void()> done) {
  // Broadcast and the local apply read the same bytes at once.
  auto pending = std::make_shared<int>(2);
  auto both = [pending, done = std::move(done)] {
    if (--*pending == 0) done();
  };
  broadcast_meter_.begin();
  broadcast_->async_broadcast(source, [this, both](std::error_code ec) {
    broadcast_meter_.end();
    if (ec) fail("broadcast failed: " + ec.message());
    both();
  });
  apply(version, chunk, source.bytes, both);
}

buffer_ref rollout_worker::broadcast_slot(std::uint32_t slot, std::uint64_t bytes) const {
  const std::uint64_t offset = std::uint64_t{slot} * plan_->chunk_bytes;
  if (on_device()) {
    return {.bytes = {device_slots_ + offset, bytes}, .device = options_.memory->device()};
  }
  return {.bytes = {slots_.data() + offset, bytes}, .region = *slots_region_, .offset = offset};
}

void rollout_worker::follow() {
  for (;;) {
    if (!wait_for([&] { return !announcements_.empty(); })) return;
    broadcast_credits_->acquire();
    if (failed_ || stopped_) return;
    const chunk_announce a = announcements_.front();
    announcements_.pop_front();
    const auto slot = free_slots_.front();
    free_slots_.pop_front();
    const auto& c = plan_->chunks.at(a.chunk);
    const buffer_ref target = broadcast_slot(slot, c.bytes);
    const auto bytes = target.bytes;
    ++in_flight_;
    broadcast_meter_.begin();
    broadcast_->async_broadcast(
        target,
        [this, a, slot, bytes](std::error_code ec) {
          broadcast_meter_.end();
          auto release = [this, a, slot](bool applied) {
            free_slots_.push_back(slot);
            broadcast_credits_->release();
            if (applied) chunk_applied(a.version, a.chunk);
            --in_flight_;
            changed();
          };
          if (ec) {
            fail("broadcast failed: " + ec.message());
            return release(false);
          }
          // Verify off the loop, then apply; the completion must not block the loop. Device slots
          // are not hashed here: the leader verified the host bytes it uploaded.
          auto actual = std::make_shared<std::uint64_t>(0);
          const bool check = options_.checksums && a.checksum != 0 && !on_device();
          worker_pool::shared().async_run(
              host().loop(), [check, actual, bytes] { if (check) *actual = XXH3_64bits(bytes.data(), bytes.size()); },
              [this, a, check, actual, bytes, release] {
                if (check && *actual != a.checksum) {
                  const auto reason = "worker " + std::to_string(instance_) + "." + std::to_string(rank_) +
                                      ": checksum mismatch in chunk " + std::to_string(a.chunk) + " of version " +
                                      std::to_string(a.version) + " from the instance broadcast";
                  send(coordinator_, participant_error{.reason = reason});
                  fail(reason);
                  return release(false);
                }
                apply(a.version, a.chunk, bytes, [release] { release(true); });
              });
        });
  }
}

void rollout_worker::apply(std::uint64_t, std::uint32_t chunk, std::span<const std::byte> bytes,
                           std::function<void()> done) {
  std::vector<copy_piece> pieces;
  for (const auto& p : plan_->chunks[chunk].pieces) {
    pieces.push_back({tensors_[local_of_[p.tensor]].data + p.tensor_offset, bytes.data() + p.chunk_offset, p.bytes});
  }
  apply_meter_.begin();
  copies_.async_copy(std::move(pieces), [this, chunk, done = std::move(done)](std::error_code ec) {
    apply_meter_.end();
    if (ec) fail("apply of chunk " + std::to_string(chunk) + " failed: " + ec.message());
    done();
  });
}

void rollout_worker::chunk_applied(std::uint64_t version, std::uint32_t chunk) {
  auto& p = progress_[version];
  if (p.tensor_bytes.empty()) p.tensor_bytes.assign(plan_->tensors.size(), 0);
  for (const auto& piece : plan_->chunks[chunk].pieces) {
    auto& got = p.tensor_bytes[piece.tensor] += piece.bytes;
    if (got == plan_->tensors[piece.tensor].nbytes && on_tensor) {
      const auto& t = tensors_[local_of_[piece.tensor]];
      on_tensor(version, t.spec, std::span<const std::byte>(t.data, t.spec.nbytes));
    }
  }
  if (++p.chunks < plan_->chunks.size()) return;

  progress_.erase(version);
  complete_version_ = std::max(complete_version_, version);
  version_complete m{.instance = instance_, .rank = rank_, .version = version,
                     .busy = {.upload = upload_meter_.seconds(), .broadcast = broadcast_meter_.seconds(),
                              .apply = apply_meter_.seconds()}};
  upload_meter_.reset();
  broadcast_meter_.reset();
  apply_meter_.reset();
  if (!options_.digests) {
    send(coordinator_, m);
    if (on_version) on_version(version);
    return;
  }
  auto report = std::make_shared<version_complete>(std::move(m));
  ++in_flight_;
  worker_pool::shared().async_run(
      host().loop(),
      [this, report] {
        for (std::uint32_t i = 0; i < plan_->tensors.size(); ++i) {
          const auto& t = tensors_[local_of_[i]];
          const auto h = XXH3_128bits(t.data, t.spec.nbytes);
          report->digests.push_back({.tensor = i, .low = h.low64, .high = h.high64});
        }
      },
      [this, report, version] {
        send(coordinator_, *report);
        --in_flight_;
        if (on_version) on_version(version);
      });
}

}  // namespace ferry
