// What arrives at a rollout worker: writes into its slots and the trainers' word of them
// (chunk_sent), requests for direct slots, and the instance's order of chunks.

#include <algorithm>

#include "actors/rollout_worker.hpp"
#include "runtime/log.hpp"
#include "runtime/node.hpp"

namespace ferry {

void rollout_worker::on_slot_landed(write_imm imm) {
  const auto value = imm_value(imm);
  if (!gen_) return;
  if (!imm_of_epoch(value, epoch()))
    return note("stale write dropped");  // an older epoch's, landing late
  const std::uint32_t slot = imm_number(value);
  auto& g = *gen_;
  if (auto it = g.sent.find(slot); it != g.sent.end()) {
    if (is_direct(slot)) {
      g.direct.push_back({slot, it->second});
      changed();
    } else {
      stripe_ready(g, {slot, it->second});
    }
    g.sent.erase(it);
  } else {
    g.landed[slot] = true;
  }
}

void rollout_worker::stripe_ready(generation& g, received r) {
  auto& a = g.awaited;
  const bool awaited = a && !a->at && a->version == r.meta.version && a->chunk == r.meta.chunk;
  if (awaited) a->at = g.ready.size();
  g.ready.push_back(std::move(r));
  if (awaited || g.stripe == 0) changed();
}

bool rollout_worker::is_direct(std::uint32_t slot) const {
  return plan_->direct && slot - direct_slot_ < direct_slots();
}

void rollout_worker::on_slot_request(const envelope_header& h, const slot_request& m) {
  if (!gen_ || m.chunk >= plan_->job->chunks.size() || !plan_->heard_directly[m.chunk] ||
      h.from != plan_->job->shards.at(plan_->job->chunks[m.chunk].shard)) {
    log::warn("worker {}.{}: dropped a slot_request from node {} for chunk {}", instance_, rank_,
              h.from.node, m.chunk);
    return note("slot_request not for a chunk its trainer sends here");
  }
  gen_->grants.request(h.from, plan_->job->chunks[m.chunk].shard, m);
  grant_slots(*gen_);
}

void rollout_worker::grant_slots(generation& g) {
  g.grants.grant_free_slots([this](const address& trainer, slot_grant grant) {
    grant.slot += direct_slot_;
    send(trainer, grant);
  });
}

std::uint32_t rollout_worker::first_shard() const {
  std::uint64_t place = 0, workers = 0;  // this worker's among all instances' workers
  for (const auto& inst : plan_->job->instances) {
    const auto at = std::find(inst.workers.begin(), inst.workers.end(), self());
    if (inst.id == instance_) place = workers + (at - inst.workers.begin());
    workers += inst.workers.size();
  }
  return static_cast<std::uint32_t>(place * plan_->job->shards.size() /
                                    std::max<std::uint64_t>(workers, 1));
}

void rollout_worker::on_chunk_sent(const envelope_header& h, const chunk_sent& m) {
  const bool direct = gen_ && is_direct(m.slot);
  if (!gen_ || m.chunk >= plan_->job->chunks.size() ||
      (!direct && (!leader_ || m.slot >= plan_->job->shards.size() * plan_->job->depth)) ||
      (direct && !plan_->mine[m.chunk]) || (!direct && !m.relay.empty())) {
    log::warn("worker {}.{}: ignored chunk_sent for slot {} chunk {}", instance_, rank_, m.slot,
              m.chunk);
    return;
  }
  // Only the trainer shard that sources the chunk says it landed: in its own slots at a leader,
  // in the direct slot granted to it for that chunk. A chunk relayed along a chain comes from the
  // worker before this one instead: a member of the instance that hears it.
  const auto& c = plan_->job->chunks[m.chunk];
  const auto trainer = plan_->job->shards.at(c.shard);
  bool from_sender = false;
  if (direct) {
    const auto& grant = gen_->grants.granted(m.slot - direct_slot_);
    const bool relayed = plan_->job->hears(c.audience, h.from) &&
                         std::find(others_.begin(), others_.end(), h.from) != others_.end();
    from_sender = grant && grant->trainer == trainer && grant->version == m.version &&
                  grant->chunk == m.chunk && (h.from == trainer || relayed);
  } else {
    from_sender = h.from == trainer && m.slot / plan_->job->depth == c.shard;
  }
  if (!from_sender) {
    log::warn(
        "worker {}.{}: dropped a chunk_sent from node {} for slot {} chunk {}: trainer shard {} "
        "(node {}) sources it",
        instance_, rank_, h.from.node, m.slot, m.chunk, c.shard, trainer.node);
    return note("chunk_sent not from the chunk's trainer");
  }
  auto& g = *gen_;
  if (direct) {  // the whole chunk, which its instance does not hear whole
    if (g.landed.erase(m.slot) > 0 || m.in_place()) {
      g.direct.push_back({m.slot, m});
      changed();
    } else {
      g.sent[m.slot] = m;
    }
    return;
  }
  // An empty stripe (of a small chunk) or one read in place has no write to wait for.
  if (g.landed.erase(m.slot) > 0 || m.in_place() ||
      stripe_of(plan_->job->chunks[m.chunk].bytes, g.stripes, *g.stripe).bytes == 0) {
    stripe_ready(g, {m.slot, m});
  } else {
    g.sent[m.slot] = m;
  }
}

std::optional<rollout_worker::work> rollout_worker::next_chunk(
    const std::shared_ptr<generation>& g) {
  if (g->stripe == 0) {  // the first leader orders the instance's chunks as they arrive
    if (!wait_for([&] { return g != gen_ || !g->ready.empty(); }) || !current(g))
      return std::nullopt;
    work w{.version = g->ready.front().meta.version,
           .chunk = g->ready.front().meta.chunk,
           .checksum = g->ready.front().meta.chunk_checksum,
           .mine = std::move(g->ready.front()),
           .plan = plan_};
    g->ready.pop_front();
    return w;
  }
  if (!wait_for([&] { return g != gen_ || !g->announcements.empty(); }) || !current(g))
    return std::nullopt;
  const chunk_announce a = g->announcements.front();
  g->announcements.pop_front();
  work w{.version = a.version, .chunk = a.chunk, .checksum = a.checksum, .plan = plan_};
  if (!g->stripe) return w;
  // Another leader: its stripe of the announced chunk may still be on the way.
  auto it = std::find_if(g->ready.begin(), g->ready.end(), [&](const received& r) {
    return r.meta.version == a.version && r.meta.chunk == a.chunk;
  });
  if (it == g->ready.end()) {
    g->awaited = {.version = a.version, .chunk = a.chunk};
    const bool waited = wait_for([&] { return g != gen_ || g->awaited->at; });
    const auto at = g->awaited->at;
    g->awaited.reset();
    if (!waited || !current(g)) return std::nullopt;
    it = g->ready.begin() + static_cast<std::ptrdiff_t>(*at);
  }
  w.mine = std::move(*it);
  g->ready.erase(it);
  return w;
}

}  // namespace ferry
