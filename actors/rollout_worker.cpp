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
        std::vector<tensor_spec> specs;
        std::vector<byte_range> held;
        specs.reserve(local->size());
        held.reserve(local->size());
        for (const auto& t : *local) {
          specs.push_back(t.spec);
          held.push_back(t.held());
        }
        return std::make_shared<const registered_table>(registered_table{
            .tensors = shared_vector(std::move(specs)), .parts = shared_vector(std::move(held))});
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

  report_complete(version);
}

void rollout_worker::report_complete(std::uint64_t version) {
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
