#include "actors/rollout_worker.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "runtime/await.hpp"
#include "runtime/copy_engine.hpp"
#include "runtime/log.hpp"
#include "runtime/node.hpp"
#include "runtime/shared_per_sources.hpp"

namespace ferry {

rollout_worker::rollout_worker(node& host, actor_id id, address coordinator, std::uint32_t instance,
                               std::uint32_t rank, std::vector<tensor_ref> tensors,
                               worker_options options)
    : rollout_worker(host, id, coordinator, instance, rank,
                     std::make_shared<const std::vector<tensor_ref>>(std::move(tensors)),
                     std::move(options)) {}

rollout_worker::rollout_worker(node& host, actor_id id, address coordinator, std::uint32_t instance,
                               std::uint32_t rank,
                               std::shared_ptr<const std::vector<tensor_ref>> tensors,
                               worker_options options)
    : job_member(host, id, coordinator, options.heartbeat_interval),
      instance_(instance),
      rank_(rank),
      tensors_(std::move(tensors)),
      takes_trainers_table_(tensors_->empty()),
      options_(std::move(options)),
      staging_(host.env(), host.transport(), options_.memory, [this] { changed(); }),
      sources_(host.env(), options_.memory,
               "worker " + std::to_string(instance) + "." + std::to_string(rank)),
      hasher_(host.env(), options_.memory),
      upload_meter_(host.env(), host.id(), stage::upload),
      broadcast_meter_(host.env(), host.id(), stage::broadcast),
      apply_(host.env(), host.id()) {
  if (std::any_of(tensors_->begin(), tensors_->end(),
                  [](const tensor_ref& t) { return !t.data; })) {
    auto own = *tensors_;
    for (auto& t : own) {
      if (t.data) continue;
      owned_.push_back(host.env().platform().host_memory(t.held().bytes));
      t.data = owned_.back().data();
    }
    tensors_ = std::make_shared<const std::vector<tensor_ref>>(std::move(own));
  }
  on_coordinator<plan_ready>([this](const envelope_header&, const plan_ready& m) {
    admitted();
    adopt_plan(m);
  });
  on<chunk_sent>(
      [this](const envelope_header& h, const chunk_sent& m) {
        if (h.epoch == epoch()) on_chunk_sent(h, m);
      },
      handling::never_suspends);
  on<slot_request>(
      [this](const envelope_header& h, const slot_request& m) {
        if (h.epoch == epoch()) on_slot_request(h, m);
      },
      handling::never_suspends);
  on<chunk_announce>(
      [this](const envelope_header& h, const chunk_announce& m) {
        if (h.epoch != epoch() || !gen_) return;
        if (h.from != gen_->orderer || gen_->stripe == 0) {
          // Only the first leader orders the instance's chunks; anyone else would desynchronise it.
          log::warn(
              "worker {}.{}: dropped a chunk_announce from node {}: node {} orders this instance",
              instance_, rank_, h.from.node, gen_->orderer.node);
          return note("chunk_announce not from the first leader");
        }
        gen_->announcements.push_back(m);
        if (!gen_->awaited) changed();
      },
      handling::never_suspends);
  on_coordinator<update_failed>([this](const envelope_header&, const update_failed& m) {
    // The version cannot complete anywhere; what arrived of it must not count later.
    log::warn("worker {}.{}: update of version {} failed: {}", instance_, rank_, m.version,
              m.reason);
    progress_.erase(m.version);
    if (on_update_failed) on_update_failed(m.version, m.reason);
  });
}

rollout_worker::~rollout_worker() {
  stop_member();
  if (gen_) gen_->broadcast->abort();
  if (fibers_ > 0 || in_flight_ > 0)
    host().loop().run_until([this] { return fibers_ == 0 && in_flight_ == 0; });
  gen_.reset();
  host().forget_writes(leader_slot_tag);
  host().forget_writes(chain_tag);
  for (auto* p : owned_on_device_) options_.memory->release(p);
}

result<std::vector<tensor_ref>> rollout_worker::keep_trainers_table(
    const std::vector<tensor_spec>& table) {
  std::vector<tensor_ref> own;
  for (const auto& spec : table) {
    if (!on_device()) {
      owned_.push_back(host().env().platform().host_memory(spec.nbytes));
      own.push_back({.spec = spec, .data = owned_.back().data()});
      continue;
    }
    auto p = options_.memory->allocate(spec.nbytes);
    if (!p) return std::unexpected(p.error());
    owned_on_device_.push_back(*p);
    own.push_back({.spec = spec, .data = *p, .device = options_.memory->device()});
  }
  return own;
}

void rollout_worker::join() {
  join_with([this] {
    register_worker m{.instance = instance_,
                      .rank = rank_,
                      .transport_address = host().transport().local_address(),
                      .on_device = on_device(),
                      .place = place()};
    // A worker that took the trainers' table still takes it (registers none) when it registers
    // again.
    if (!takes_trainers_table_) {
      if (!registered_) registered_ = registered_table::of(tensors_);
      m.tensors = registered_->tensors;
      m.parts = registered_->parts;
    }
    return m;
  });
}

std::shared_ptr<const rollout_worker::registered_table> rollout_worker::registered_table::of(
    const std::shared_ptr<const std::vector<tensor_ref>>& local) {
  return shared_per_sources<registered_table>(
      [&] {
        std::vector<tensor_spec> tensors;
        std::vector<byte_range> parts;
        tensors.reserve(local->size());
        parts.reserve(local->size());
        for (const auto& t : *local) {
          tensors.push_back(t.spec);
          parts.push_back(t.held());
        }
        return std::make_shared<const registered_table>(
            registered_table{.tensors = shared_vector(std::move(tensors)),
                             .parts = shared_vector(std::move(parts))});
      },
      local);
}

std::string rollout_worker::name() const {
  return "worker " + std::to_string(instance_) + "." + std::to_string(rank_);
}

void rollout_worker::halting() {
  if (gen_) gen_->credits->release();
}

void rollout_worker::adopt_plan(const plan_ready& m) {
  link_to(m.peers);
  const auto it = std::find_if(m.plan.instances.begin(), m.plan.instances.end(),
                               [&](const instance_plan& i) { return i.id == instance_; });
  if (it == m.plan.instances.end() ||
      std::find(it->workers.begin(), it->workers.end(), self()) == it->workers.end()) {
    return fail("the plan of epoch " + std::to_string(m.plan.epoch) +
                " does not include this worker");
  }
  // A new epoch abandons the old one's staging work: its broadcast group is aborted, and chunks
  // it did not apply are sent again if the coordinator finds some member lacks them.
  if (gen_) {
    gen_->broadcast->abort();
    for (std::uint32_t i = 0; plan_ && i < plan_->job->depth; ++i) gen_->credits->release();
  }
  const bool was_leader = leader_;
  if (takes_trainers_table_ && tensors_->empty()) {
    auto own = keep_trainers_table(m.plan.tensors);
    if (!own) {
      return fail(fmt::format("no room for the trainers' {} bytes on GPU {}", m.plan.total_bytes(),
                              options_.memory->device()));
    }
    tensors_ = std::make_shared<const std::vector<tensor_ref>>(std::move(*own));
  }
  if (plan_ && plan_->job->layout != m.plan.layout) {
    // Chunk ids mean other bytes now: what arrived of a version not complete here is sent again.
    std::erase_if(progress_, [this](const auto& p) { return p.first > complete_version_; });
  }
  auto next = std::make_shared<worker_plan>(worker_plan{.job = share_plan(m.plan)});
  if (auto why = next->derive(tensors_, self(), *it); !why.empty()) {
    return fail("the plan of epoch " + std::to_string(m.plan.epoch) + " " + why);
  }
  plan_ = std::move(next);
  set_epoch(plan_->job->epoch);
  // A regroup may follow a trainer's death: let go of its host copies (readers keep theirs).
  sources_.forget_dead();
  const auto& inst = *it;
  const auto members = collective_ranks(inst);
  std::optional<std::uint32_t> stripe;
  if (const auto at = std::find(members.begin(), members.begin() + inst.leaders.size(), self());
      at != members.begin() + inst.leaders.size()) {
    stripe = static_cast<std::uint32_t>(at - members.begin());
  }
  leader_ = stripe.has_value();
  if (leader_ && !was_leader && gen_)
    log::info("worker {}.{}: takes over as leader of instance {}", instance_, rank_, instance_);
  others_.clear();
  for (const auto& w : inst.workers) {
    if (w != self()) others_.push_back(w);
  }

  if (auto why = prepare_staging(static_cast<std::uint32_t>(inst.leaders.size())))
    return fail_job(*why);
  start_generation(members, stripe, static_cast<std::uint32_t>(inst.leaders.size()));
}

void rollout_worker::start_generation(const std::vector<address>& members,
                                      std::optional<std::uint32_t> stripe, std::uint32_t stripes) {
  auto g = std::make_shared<generation>();
  g->stripes = stripes;
  g->stripe = stripe;
  g->credits = std::make_unique<slot_counter>(plan_->job->depth);
  for (std::uint32_t i = 0; i < plan_->job->depth; ++i) g->free_slots.push_back(i);
  g->grants =
      direct_slot_grants(plan_->direct ? direct_slots() : 0,
                         static_cast<std::uint32_t>(plan_->job->shards.size()), first_shard());
  g->orderer = members.front();
  g->broadcast = options_.make_broadcast(*this, members, plan_->job->epoch);
  gen_ = g;
  changed();

  if (leader_ || plan_->direct)
    host().on_write(leader_slot_tag, [this](const write_notice& n) { on_slot_landed(n.imm); });
  else
    host().forget_writes(leader_slot_tag);
  ++fibers_;
  host().loop().spawn([this, g] {
    serve(g);
    --fibers_;
  });
  if (plan_->direct) {
    ++fibers_;
    host().loop().spawn([this, g] {
      serve_direct(g);
      --fibers_;
    });
  }
  // The old epoch's readers of the staging (apply, upload) finish first, so that no write of the
  // new epoch lands under them, and so do the writes into it that the old key let in, so that
  // none lands over the new epoch's; then the worker says what it holds.
  if (in_flight_ > 0) note("new epoch waits for old readers");
  if (!staging_.settled()) note("new epoch waits for older writes to land");
  ++fibers_;
  host().loop().spawn([this, g] {
    if (wait_for([&] { return g != gen_ || (in_flight_ == 0 && staging_.settled()); }) &&
        g == gen_) {
      auto ready = holdings();
      if (leader_ || plan_->direct) ready.slots = *staging_.region();
      ready.direct_slot = direct_slot_;
      ready.slot_bytes = staging_.slot_bytes();
      send(coordinator_, ready);
    }
    --fibers_;
  });
}

std::optional<std::string> rollout_worker::prepare_staging(std::uint32_t stripes) {
  // Receive slots are on the GPU where trainers can write there; a worker that hears chunks its
  // instance does not hear whole has direct slots for those, which it grants to any trainer.
  const auto slots = worker_slots::of(*plan_->job, {.leader = leader_,
                                                    .stripes = stripes,
                                                    .on_device = on_device(),
                                                    .rdma = place().rdma,
                                                    .hears_directly = plan_->direct});
  direct_slot_ = slots.first_direct;
  return staging_.prepare(slots, plan_->job->chunk_bytes);
}

device_place rollout_worker::place() const {
  if (!on_device()) return {};
  auto p = options_.memory->place();
  p.rdma = !p.gpu.empty() && host().transport().reaches_device_memory();
  return p;
}

worker_ready rollout_worker::holdings() const {
  worker_ready m{.instance = instance_, .rank = rank_, .complete_version = complete_version_};
  for (const auto& [version, p] : progress_) {
    if (version <= complete_version_ || version < m.partial_version) continue;
    m.partial_version = version;
    m.partial_chunks.clear();
    for (std::uint32_t c = 0; c < p.applied.size(); ++c) {
      if (p.applied[c]) m.partial_chunks.push_back(c);
    }
  }
  return m;
}

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

bool rollout_worker::checksum_ok(std::span<const std::byte> bytes, std::uint64_t expected) {
  if (!options_.checksums || expected == 0) return true;
  return chunk_checksum(host().env(), bytes) == expected;
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

void rollout_worker::chunk_applied(const worker_plan& plan, std::uint64_t version,
                                   std::uint32_t chunk) {
  if (version <= complete_version_) return;  // a resent chunk of a version already complete here
  if (plan.job->layout != plan_->job->layout) return;  // its chunk ids mean other bytes now
  auto& p = progress_[version];
  if (p.applied.empty()) {
    p.applied.assign(plan_->job->chunks.size(), false);
    // Counted only for `on_tensor`: a simulation's workers apply hundreds of thousands of pieces.
    if (on_tensor) p.tensor_bytes.assign(plan_->job->tensors.size(), 0);
  }
  if (p.applied[chunk]) return;  // sent again after a regroup: same bytes, counted once
  p.applied[chunk] = true;
  if (!p.tensor_bytes.empty()) {
    for (const auto& piece : plan_->job->chunks[chunk].pieces) {
      const auto& t = (*tensors_)[plan_->placement->local_index(piece.tensor)];
      auto& got = p.tensor_bytes[piece.tensor] += piece.bytes;
      if (got == t.held().bytes)
        on_tensor(version, t.spec, std::span<const std::byte>(t.data, got));
    }
  }
  if (++p.chunks < plan_->mine_count) return;

  progress_.erase(version);
  complete_version_ = version;
  std::erase_if(progress_, [&](const auto& e) { return e.first <= version; });
  version_complete m{.instance = instance_,
                     .rank = rank_,
                     .version = version,
                     .busy = {.upload = upload_meter_.seconds(),
                              .broadcast = broadcast_meter_.seconds(),
                              .apply = apply_.meter().seconds()}};
  upload_meter_.reset();
  broadcast_meter_.reset();
  apply_.meter().reset();
  if (!options_.digests) {
    send(coordinator_, m);
    if (on_version) on_version(version);
    return;
  }
  auto report = std::make_shared<version_complete>(std::move(m));
  ++in_flight_;
  auto finish = [this, report, version] {
    // Before the report: the job cannot move on to a later version while on_version runs.
    if (on_version) on_version(version);
    send(coordinator_, *report);
    ended_in_flight();
  };
  if (std::any_of(tensors_->begin(), tensors_->end(),
                  [](const tensor_ref& t) { return t.device >= 0; })) {
    // Device tensors are hashed from host bytes: each is copied into a pinned bounce buffer first.
    host().loop().spawn([this, report, finish] {
      digest_through_host(*report);
      finish();
    });
    return;
  }
  host().env().cpu().async_run(
      held_bytes(*tensors_),
      [this, report, plan = plan_] {
        for (const auto i : plan->heard_segments) {
          const auto& s = plan->job->segments[i];
          const auto& t = (*tensors_)[plan->placement->local_index(s.tensor)];
          const auto h = XXH3_128bits(t.data + (s.offset - t.held().offset), s.bytes);
          report->digests.push_back({.segment = i, .low = h.low64, .high = h.high64});
        }
      },
      finish);
}

void rollout_worker::digest_through_host(version_complete& report) {
  const auto plan = plan_;
  for (const auto i : plan->heard_segments) {
    const auto& s = plan->job->segments[i];
    const auto& t = (*tensors_)[plan->placement->local_index(s.tensor)];
    const auto h = hasher_.hash({t.data + (s.offset - t.held().offset), s.bytes}, t.device >= 0);
    if (!h)
      return fail("cannot read tensor '" + t.spec.name +
                  "' for its digest: " + h.error().message());
    report.digests.push_back({.segment = i, .low = h->low64, .high = h->high64});
  }
}

}  // namespace ferry
