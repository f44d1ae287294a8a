// One chunk from where it arrived to applied: a leader verifies its stripe and uploads it,
// the instance broadcasts or all-gathers it, every member verifies and applies it; a chunk that
// comes to a worker alone is verified, relayed along its chain and applied.

#include <xxhash.h>

#include <cstring>

#include "actors/rollout_worker.hpp"
#include "runtime/copy_engine.hpp"
#include "runtime/log.hpp"
#include "runtime/node.hpp"

namespace ferry {

bool rollout_worker::checksum_ok(std::span<const std::byte> bytes, std::uint64_t expected) {
  if (!options_.checksums || expected == 0) return true;
  return chunk_checksum(host().env(), bytes) == expected;
}

void rollout_worker::serve(std::shared_ptr<generation> g) {
  const auto plan = plan_;  // chunk references below outlive suspensions
  for (;;) {
    auto w = next_chunk(g);
    if (!w) return;
    g->credits->acquire();
    if (!current(g)) return;
    const auto& c = plan->job->chunks.at(w->chunk);
    std::span<const std::byte> stripe;  // a leader's stripe of the chunk, where it lies
    if (w->mine) {
      // A leader verifies the stripe it received before anything reads it.
      const auto part = stripe_of(c.bytes, g->stripes, *g->stripe);
      const auto slot = staging_.receive_slot(w->mine->slot, c.bytes).bytes;
      stripe = worker_slots::stripe_only(staging_.slot_bytes(), plan->job->chunk_bytes)
                   ? slot.first(part.bytes)
                   : slot.subspan(part.offset, part.bytes);
      bool device_bytes =
          staging_.on_device();  // written into the GPU, or read GPU to GPU: no host byte to hash
      if (const auto& m = w->mine->meta; m.in_place()) {  // the chunk lies in the trainer's copy
        std::string why;
        auto in_place = sources_.chunk(m, c.bytes, why);
        // A trainer that died is the coordinator's to detect; the regroup resends what is missing.
        if (!in_place && in_place.error() == errc::stopped) return;
        if (!in_place) return fail_job(why);
        if (!current(g)) return;
        device_bytes = in_place->on_device;
        if (on_device()) {  // uploaded straight from there
          stripe = in_place->bytes.subspan(part.offset, part.bytes);
          w->source = std::move(in_place->copy);
        } else {  // the host chain broadcasts from registered memory: the receive slot
          host().env().cpu().run(part.bytes, [&] {
            std::memcpy(slot.data() + part.offset, in_place->bytes.data() + part.offset,
                        part.bytes);
          });
          if (!current(g)) return;
        }
      }
      if (!device_bytes && !checksum_ok(stripe, w->mine->meta.checksum)) {
        if (!current(g)) return;  // the new epoch may already be writing this slot
        return fail_job("checksum mismatch in its stripe (as a leader) of chunk " +
                        std::to_string(c.id) + " of version " + std::to_string(w->version) +
                        " from trainer shard " + std::to_string(c.shard) + " (node " +
                        std::to_string(plan->job->shards.at(c.shard).node) + ")");
      }
      if (!current(g)) return;
    }
    if (g->stripe == 0) {  // encoded once for the instance's other members
      const auto announce = encode_body(
          chunk_announce{.version = w->version, .chunk = c.id, .checksum = w->checksum});
      for (const auto& m : others_) send(m, announce, nullptr);
    }
    ++in_flight_;
    deliver(g, plan, std::move(*w), stripe);
  }
}

void rollout_worker::serve_direct(std::shared_ptr<generation> g) {
  const auto plan = plan_;  // chunk references below outlive suspensions
  for (;;) {
    if (!wait_for([&] { return g != gen_ || !g->direct.empty(); }) || !current(g)) return;
    const received r = g->direct.front();
    g->direct.pop_front();
    const auto& c = plan->job->chunks.at(r.meta.chunk);
    std::span<const std::byte> bytes = staging_.receive_slot(r.slot, c.bytes).bytes;
    std::shared_ptr<const mapped_source> source;  // the trainer's copy, when read in place
    bool device_bytes = staging_.on_device();
    if (r.meta.in_place()) {
      std::string why;
      auto in_place = sources_.chunk(r.meta, c.bytes, why);
      if (!in_place && in_place.error() == errc::stopped)
        return;  // the regroup resends what is missing
      if (!in_place) return fail_job(why);
      if (!current(g)) return;
      source = std::move(in_place->copy);
      bytes = in_place->bytes;
      device_bytes = in_place->on_device;
      // Every member that hears a chunk read GPU to GPU reads it itself: no write carries it on.
      if (device_bytes && !r.meta.relay.empty())
        return fail_job("a chunk read GPU to GPU came with a chain to relay it along");
    }
    // The slot is free again once the chunk is applied here and, in a chain, relayed onward.
    auto uses = std::make_shared<int>(r.meta.relay.empty() ? 1 : 2);
    auto release = [this, g, uses, index = r.slot - direct_slot_] {
      if (--*uses > 0 || !current(g)) return;
      g->grants.release(index);
      grant_slots(*g);
    };
    // Relayed before it is verified here: the next worker verifies it too, and waits less.
    if (!r.meta.relay.empty()) relay(g, r.meta, bytes, release);
    if (!device_bytes && !checksum_ok(bytes, r.meta.checksum)) {
      if (!current(g)) return;  // the new epoch may already be writing this slot
      return fail_job("checksum mismatch in chunk " + std::to_string(c.id) + " of version " +
                      std::to_string(r.meta.version) + " from trainer shard " +
                      std::to_string(c.shard));
    }
    if (!current(g)) return;
    ++in_flight_;
    apply(*plan, r.meta.version, c.id, bytes, [this, r, source, plan, release] {
      release();
      chunk_applied(*plan, r.meta.version, r.meta.chunk);
      ended_in_flight();
    });
  }
}

void rollout_worker::relay(const std::shared_ptr<generation>& g, const chunk_sent& m,
                           std::span<const std::byte> bytes, std::function<void()> done) {
  const auto next = m.relay.front();
  chunk_sent onward = m;
  onward.slot = next.slot;
  onward.relay.erase(onward.relay.begin());
  ++in_flight_;
  const auto began = broadcast_meter_.begin();
  host().transport().async_write(bytes, next.slots, next.offset,
                                 make_imm(leader_slot_tag, epoch_imm_value(epoch(), next.slot)),
                                 [this, g, onward = std::move(onward), to = next.worker, began,
                                  done = std::move(done), n = bytes.size()](std::error_code ec) {
                                   broadcast_meter_.end(began, onward.version, onward.chunk, n);
                                   if (ec) {
                                     // A dead worker is the coordinator's to detect; the regroup
                                     // resends what is missing.
                                     if (current(g))
                                       log::warn(
                                           "worker {}.{}: relay of chunk {} to node {} failed: {}",
                                           instance_, rank_, onward.chunk, to.node, ec.message());
                                   } else if (current(g)) {
                                     send(to, onward);
                                   }
                                   done();
                                   ended_in_flight();
                                 });
}

void rollout_worker::deliver(const std::shared_ptr<generation>& g,
                             const std::shared_ptr<const worker_plan>& plan, work w,
                             std::span<const std::byte> stripe) {
  const auto& c = plan->job->chunks.at(w.chunk);
  auto d = std::make_shared<delivery>(
      delivery{.g = g, .w = std::move(w), .shard = plan->job->shards.at(c.shard)});
  // Where the instance's collective runs: a leader's receive slot where it lies where the
  // collective runs and holds the whole chunk's layout (host memory on a host, the GPU where
  // trainers write there), else a broadcast slot, into which a device leader uploads its stripe.
  const auto& mine = d->w.mine;
  const bool gathers_in_slot =
      staging_.on_device() &&
      !worker_slots::stripe_only(staging_.slot_bytes(), plan->job->chunk_bytes);
  const bool upload = mine && on_device() && (d->w.source || !gathers_in_slot);
  if (mine && !upload) {
    d->target = staging_.receive_slot(mine->slot, c.bytes);
    d->slot_until_applied = true;
  } else {
    d->dslot = g->free_slots.front();
    g->free_slots.pop_front();
    d->target = broadcast_slot(*d->dslot, c.bytes);
  }
  if (!upload) return collect(std::move(d));
  // UPLOAD: the leader's stripe onto the device; its receive slot is free once the bytes are there.
  const auto part = stripe_of(c.bytes, g->stripes, *g->stripe);
  d->began = upload_meter_.begin();
  host().env().copies().async_copy(
      {{d->target.bytes.data() + part.offset, stripe.data(), part.bytes}},
      [this, d, bytes = part.bytes](std::error_code ec) mutable {
        upload_meter_.end(d->began, d->w.version, d->w.chunk, bytes);
        free_receive_slot(*d);
        if (ec) fail("upload of chunk " + std::to_string(d->w.chunk) + " failed: " + ec.message());
        collect(std::move(d));
      });
}

void rollout_worker::free_receive_slot(const delivery& d) {
  if (current(d.g)) send(d.shard, slot_free{.version = d.w.version, .slot = d.w.mine->slot});
}

void rollout_worker::end_delivery(delivery& d, bool applied) {
  if (d.dslot) d.g->free_slots.push_back(*d.dslot);
  if (d.slot_until_applied) free_receive_slot(d);
  if (applied) chunk_applied(*d.w.plan, d.w.version, d.w.chunk);
  d.g->credits->release();
  ended_in_flight();
}

void rollout_worker::collect(std::shared_ptr<delivery> d) {
  auto& g = *d->g;
  d->began = broadcast_meter_.begin();
  if (g.stripes == 1 && d->w.mine) {
    // The only leader: it broadcasts and applies its own bytes at once.
    d->pending = 2;
    g.broadcast->async_broadcast(d->target, [this, d](std::error_code ec) {
      broadcast_meter_.end(d->began, d->w.version, d->w.chunk, d->target.bytes.size());
      // A member died or the epoch moved on: the regroup resends what the instance lacks.
      if (ec && current(d->g))
        log::warn("worker {}.{}: broadcast failed: {}", instance_, rank_, ec.message());
      if (--d->pending == 0) end_delivery(*d, true);
    });
    return apply(*d->w.plan, d->w.version, d->w.chunk, d->target.bytes, [this, d] {
      if (--d->pending == 0) end_delivery(*d, true);
    });
  }
  auto collected = [this, d](std::error_code ec) {
    broadcast_meter_.end(d->began, d->w.version, d->w.chunk, d->target.bytes.size());
    if (ec && current(d->g))
      log::warn("worker {}.{}: broadcast failed: {}", instance_, rank_, ec.message());
    if (ec || !current(d->g))
      return end_delivery(*d, false);  // the regroup resends what is missing
    // Who did not receive the whole chunk from a trainer verifies it, off the loop. Device slots
    // are not hashed: each leader verified the host bytes it uploaded.
    const bool check = options_.checksums && d->w.checksum != 0 && !on_device();
    const auto bytes = d->target.bytes;
    host().env().cpu().async_run(
        check ? bytes.size() : 0,
        [check, d, bytes] {
          if (check) d->actual = XXH3_64bits(bytes.data(), bytes.size());
        },
        [this, d, check, bytes] {
          if (!current(d->g))
            return end_delivery(*d, false);  // the new epoch may already be writing this slot
          if (check && d->actual != d->w.checksum) {
            fail_job("checksum mismatch in chunk " + std::to_string(d->w.chunk) + " of version " +
                     std::to_string(d->w.version) + " from the instance's collective");
            return end_delivery(*d, false);
          }
          apply(*d->w.plan, d->w.version, d->w.chunk, bytes, [this, d] { end_delivery(*d, true); });
        });
  };
  if (g.stripes == 1) return g.broadcast->async_broadcast(d->target, std::move(collected));
  g.broadcast->async_all_gather(d->target, g.stripes, std::move(collected));
}

buffer_ref rollout_worker::broadcast_slot(std::uint32_t slot, std::uint64_t bytes) const {
  return on_device() ? staging_.broadcast_slot(slot, bytes) : staging_.receive_slot(slot, bytes);
}

void rollout_worker::apply(const worker_plan& plan, std::uint64_t version, std::uint32_t chunk,
                           std::span<const std::byte> bytes, std::function<void()> done) {
  apply_.run(plan.job->chunks[chunk], *plan.placement, bytes, version,
             [this, chunk, done = std::move(done)](std::error_code ec) {
               if (ec) fail("apply of chunk " + std::to_string(chunk) + " failed: " + ec.message());
               done();
             });
}

}  // namespace ferry
