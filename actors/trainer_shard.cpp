#include "actors/trainer_shard.hpp"

#include <xxhash.h>

#include <algorithm>

#include "collectives/broadcast.hpp"
#include "runtime/log.hpp"
#include "runtime/node.hpp"

namespace ferry {

trainer_shard::trainer_shard(node& host, actor_id id, address coordinator, std::uint32_t shard,
                             std::vector<tensor_ref> tensors, trainer_options options)
    : job_member(host, id, coordinator, options.heartbeat_interval),
      shard_(shard),
      tensors_(std::move(tensors)),
      options_(options),
      copies_(host.env(), host.transport(), options.memory),
      hasher_(host.env(), options.memory),
      offload_(host.env(), host.id(), options.checksums),
      send_(host.env(), host.id(), host.transport()) {
  on_coordinator<plan_ready>([this](const envelope_header&, const plan_ready& m) {
    admitted();
    adopt_plan(m);
  });
  on_coordinator<job_ready>([this](const envelope_header& h, const job_ready& m) {
    if (h.epoch != epoch()) return;
    ready_ = true;
    next_version_ = std::max(next_version_, m.next_version);
    changed();
    if (on_ready) on_ready();
  });
  on_coordinator<update_go>([this](const envelope_header& h, const update_go& m) {
    if (h.epoch == epoch()) start_sending(m);
  });
  on<slot_free>(
      [this](const envelope_header& h, const slot_free& m) {
        if (h.epoch != epoch()) return;
        for (auto [at, end] = routes_to_.equal_range(h.from); at != end; ++at) {
          auto* r = at->second;
          if (r->direct || m.slot - r->first_slot >= r->slot_count) continue;
          // A slot of the update before, freed after this one began with every slot its own.
          if (m.version != r->version) {
            note("slot_free of an earlier update dropped");
            continue;
          }
          r->free.push_back(m.slot);
          advance(*r);
        }
      },
      handling::never_suspends);
  on<slot_grant>(
      [this](const envelope_header& h, const slot_grant& m) {
        // Grants of an earlier update of this epoch cannot come: an update completes only once
        // every chunk it sent (so every slot asked for) has landed.
        if (h.epoch != epoch()) return;
        for (auto [at, end] = routes_to_.equal_range(h.from); at != end; ++at) {
          if (auto* r = at->second; r->direct && r->version == m.version) {
            r->grants[m.chunk] = m.slot;
            advance(*r);
          }
        }
      },
      handling::never_suspends);
  on_coordinator<version_delivered>([this](const envelope_header&, const version_delivered& m) {
    delivered_ = std::max(delivered_, m.version);
    settled_ = std::max(settled_, m.version);
    next_version_ = std::max(next_version_, m.version + 1);
    changed();
    if (on_delivered) on_delivered(m.version, m.verified);
  });
  on_coordinator<update_failed>(
      [this](const envelope_header&, const update_failed& m) { version_failed(m); });
}

void trainer_shard::void_version(std::uint64_t version) {
  // The coordinator fails it for everyone (this shard too), unless it did already.
  send(coordinator_, update_failed{.version = version,
                                   .reason = "offloaded in a chunk layout that changed since"});
}

void trainer_shard::version_failed(const update_failed& m) {
  settled_ = std::max(settled_, m.version);
  if (m.relaid) ready_ = false;  // the next version waits for the new layout's plan
  ++send_generation_;
  changed();
  if (on_update_failed) on_update_failed(m.version, m.reason);
}

trainer_shard::~trainer_shard() {
  stop_member();
  // Writes and hashes in flight capture the shard.
  auto idle = [this] { return fibers_ == 0 && works_in_flight_ == 0; };
  if (!idle()) host().loop().run_until(idle);
}

void trainer_shard::join() {
  join_with([this] {
    register_trainer m{
        .shard = shard_, .transport_address = host().transport().local_address(), .place = place()};
    for (const auto& t : tensors_) m.tensors.push_back(t.spec);
    return m;
  });
}

void trainer_shard::halting() {
  ++send_generation_;
}

device_place trainer_shard::place() const {
  if (!options_.memory) return {};
  auto p = options_.memory->place();
  p.rdma = !p.gpu.empty() && host().transport().reaches_device_memory();
  return p;
}

void trainer_shard::retire_routes() {
  for (auto& r : routes_) {
    r->retired = true;
    if (r->in_flight > 0) older_writes_[r->leader] += r->in_flight;
  }
  routes_.clear();
  routes_to_.clear();
  routes_left_ = 0;
}

void trainer_shard::older_write_ended(const address& leader) {
  auto it = older_writes_.find(leader);
  if (it != older_writes_.end() && --it->second == 0) {
    older_writes_.erase(it);
    for (auto [at, end] = routes_to_.equal_range(leader); at != end; ++at) advance(*at->second);
  }
}

void trainer_shard::advance_routes() {
  for (auto& r : routes_) advance(*r);
}

void trainer_shard::adopt_plan(const plan_ready& m) {
  link_to(m.peers);
  // A new epoch: senders of the old one stop; the coordinator says what to send next.
  ++send_generation_;
  ready_ = false;
  retire_routes();
  auto next = std::make_shared<shard_plan>(shard_plan{.job = share_plan(m.plan)});
  set_epoch(next->job->epoch);
  next->index = plan_index::of(next->job);
  next->placement = std::make_shared<const tensor_placement>(*next->index, tensors_, shard_);
  next->my_chunks = next->job->chunks_of(shard_);
  next->send_position.assign(next->job->chunks.size(), 0);
  for (std::uint32_t i = 0; i < next->my_chunks.size(); ++i)
    next->send_position[next->my_chunks[i]] = i;
  for (const auto& inst : next->job->instances) {
    for (std::size_t r = 0; r < inst.workers.size(); ++r)
      if (const auto p = next->job->path(shard_, inst, r); p != chunk_path::host_copy)
        next->paths.emplace(inst.workers[r], p);
  }
  plan_ = std::move(next);
  const auto& job = *plan_->job;
  if (auto why =
          copies_.prepare(job.shard_bytes[shard_], job.copies_of(shard_), job.shared_host_copies))
    return fail_job(*why);
  // Host copies made only now, for workers that do not read GPU to GPU: they get the versions
  // held so far from the device copies.
  for (auto* copy : copies_.missing_from_host()) {
    ++fibers_;
    host().loop().spawn([this, copy, plan = plan_] {
      fill_host(*copy, plan);
      --fibers_;
      changed();
    });
  }
  changed();
}

result<void> trainer_shard::publish(std::uint64_t version, std::string& why) {
  return start_publish(version, false, why);
}

result<void> trainer_shard::publish_written(std::uint64_t version, std::string& why) {
  if (options_.memory) {
    why = "a written publish takes tensors in host memory; this shard's are on a GPU";
    return ferry::fail(errc::invalid_argument);
  }
  return start_publish(version, true, why);
}

result<void> trainer_shard::start_publish(std::uint64_t version, bool written, std::string& why) {
  if (failed_) {
    why = "the job failed";
    return ferry::fail(errc::stopped);
  }
  if (!plan_) {
    why = "the shard is not ready: no plan yet";
    return ferry::fail(errc::invalid_argument);
  }
  if (version <= last_published_) {
    why = "version " + std::to_string(version) + " is not newer than the last published, " +
          std::to_string(last_published_);
    return ferry::fail(errc::invalid_argument);
  }
  last_published_ = version;
  ++fibers_;
  host().loop().spawn([this, version, written] {
    // The copy of version - 2 is reused: wait until the version it holds is settled. A
    // shard that rejoined holds none yet (it never hears of versions settled before it came).
    if (wait_for([&] {
          const auto held = copies_.for_version(version).version;
          return held == 0 || settled_ >= held || delivered_ >= held;
        })) {
      run_publish(version, written);
    }
    --fibers_;
    changed();
  });
  return {};
}

void trainer_shard::run_publish(std::uint64_t version, bool written) {
  const auto started = host().clock().now();
  const auto plan = plan_;  // a regroup during the offload must not pull the chunk table away
  auto& copy = copies_.for_version(version);
  const auto chunks = plan->job->chunks.size();
  copy.version = version;
  copy.layout = plan->job->layout;
  copy.in_host.assign(chunks, false);
  copy.in_device.assign(chunks, false);
  copy.checksums.assign(chunks, 0);
  advance_routes();  // the copy they wait for, or one of a changed layout, which voids it
  offload_.meter().reset();
  send(coordinator_, publish_started{.shard = shard_, .version = version});

  // OFFLOAD: the tensors into the device copy when the shard keeps one (the trainer may go on
  // once it is full), else into the host copy; chunk by chunk in send order, senders following.
  const bool to_device = !copy.device.empty();
  if (written ? !await_writes(copy, plan) : !offload(copy, plan, to_device)) return;
  const double stall = std::chrono::duration<double>(host().clock().now() - started).count();
  send(coordinator_, shard_offloaded{.shard = shard_, .version = version, .seconds = stall});
  if (on_offloaded) on_offloaded(version, stall);
  // The workers that do not read GPU to GPU are sent the host copy, filled from the device copy.
  if (to_device && copies_.kept().host && !fill_host(copy, plan)) return;

  shard_done done{
      .shard = shard_, .version = version, .busy = {.offload = offload_.meter().seconds()}};
  if (options_.digests) {
    auto digests = digests_of(copy, *plan);
    if (!digests) return;
    done.digests = std::move(*digests);
  }
  send(coordinator_, done);
}

bool trainer_shard::offload(shard_copies::version_copy& copy,
                            const std::shared_ptr<const shard_plan>& plan, bool to_device) {
  // `depth` chunks copying at once: the copy engine never waits for the loop between two.
  struct offloading {
    std::size_t copying = 0;
    bool stopped = false;
  };
  auto state = std::make_shared<offloading>();
  const auto version = copy.version;
  for (auto id : plan->my_chunks) {
    if (!wait_for([&] { return state->copying < plan->job->depth || state->stopped; }) ||
        state->stopped)
      break;
    ++state->copying;
    ++works_in_flight_;
    // A plan of another layout may come meanwhile: this copy is then void, and so is its version.
    offload_.async_run(
        plan->job->chunks[id], *plan->placement, to_device ? copy.device : copy.host, version,
        [this, plan] { return plan_->job->layout == plan->job->layout; }, !to_device,
        [this, state, copy = &copy, version, id, to_device](const offload_stage::outcome& done) {
          --works_in_flight_;
          --state->copying;
          if (!state->stopped && !chunk_offloaded(*copy, version, id, done, to_device))
            state->stopped = true;
          changed();
        });
  }
  wait_even_if_stopped([&] { return state->copying == 0; });
  return !state->stopped && !stopped_ && !failed_;
}

bool trainer_shard::await_writes(shard_copies::version_copy& copy,
                                 const std::shared_ptr<const shard_plan>& plan) {
  writes_ = awaited_writes{
      .version = copy.version, .copy = &copy, .plan = plan, .left = plan->my_chunks.size()};
  if (on_write_target) {
    on_write_target(copy.version,
                    std::make_shared<copy_writes>(*plan->job, *plan->placement, plan->my_chunks,
                                                  copy.host, tensors_.size()));
  }
  wait_for([&] { return writes_->left == 0 || writes_->stopped; });
  wait_even_if_stopped([&] { return writes_->hashing == 0; });
  const bool whole = writes_->left == 0 && !writes_->stopped;
  writes_.reset();
  return whole && !stopped_ && !failed_;
}

void trainer_shard::chunks_written(std::uint64_t version, std::span<const std::uint32_t> ids) {
  if (!writes_ || writes_->version != version || writes_->stopped) return;
  auto& w = *writes_;
  for (const auto id : ids) {
    ++w.hashing;
    ++works_in_flight_;
    // A plan of another layout may come meanwhile: the copy is then void, and so is its version.
    offload_.async_hash(
        w.plan->job->chunks.at(id), w.copy->host, version,
        [this, plan = w.plan] { return plan_->job->layout == plan->job->layout; },
        [this, version, id](const offload_stage::outcome& done) {
          --works_in_flight_;
          auto& awaited = *writes_;
          --awaited.hashing;
          if (!awaited.stopped && chunk_offloaded(*awaited.copy, version, id, done, false)) {
            --awaited.left;
          } else {
            awaited.stopped = true;
          }
          changed();
        });
  }
}

bool trainer_shard::chunk_offloaded(shard_copies::version_copy& copy, std::uint64_t version,
                                    std::uint32_t id, const offload_stage::outcome& done,
                                    bool device) {
  if (done.abandoned) {
    if (copy.version == version)
      void_version(version);  // else a newer version took the copy: it settled
    return false;
  }
  if (done.error) {
    fail("offload of chunk " + std::to_string(id) + " failed: " + done.error.message());
    return false;
  }
  if (device) {
    copy.in_device[id] = true;
  } else {
    copy.in_host[id] = true;
    copy.checksums[id] = done.checksum;
  }
  for (auto& r : routes_)
    if (r->next < r->chunks.size() && r->chunks[r->next] == id) advance(*r);
  return !stopped_ && !failed_;
}

bool trainer_shard::fill_host(shard_copies::version_copy& copy,
                              const std::shared_ptr<const shard_plan>& plan) {
  const auto version = copy.version;
  for (auto id : plan->my_chunks) {
    if (!copy.in_device.at(id) || copy.in_host.at(id)) continue;
    const auto done = offload_.run(plan->job->chunks[id], copy.device, copy.host, version, [&] {
      return copy.version == version && plan_->job->layout == copy.layout;
    });
    if (!chunk_offloaded(copy, version, id, done, false)) return false;
  }
  return true;
}

std::optional<std::vector<tensor_digest>> trainer_shard::digests_of(
    const shard_copies::version_copy& copy, const shard_plan& plan) {
  std::vector<std::uint32_t> owned;  // the segments of this shard's tensors
  for (std::uint32_t i = 0; i < plan.job->segments.size(); ++i) {
    const auto& s = plan.job->segments[i];
    if (plan.placement->local_index(s.tensor) >= 0 && plan.job->owner[s.tensor] == shard_)
      owned.push_back(i);
  }
  std::vector<tensor_digest> digests;
  auto add = [&](std::uint32_t i, XXH128_hash_t h) {
    digests.push_back({.segment = i, .low = h.low64, .high = h.high64});
  };
  const bool in_host = std::all_of(plan.my_chunks.begin(), plan.my_chunks.end(),
                                   [&](auto id) { return copy.in_host[id]; });
  if (in_host) {  // one pass over the host copy
    host().env().cpu().run(plan.job->shard_bytes[shard_], [&] {
      for (const auto i : owned) {
        const auto& s = plan.job->segments[i];
        add(i, XXH3_128bits(copy.host.data() + s.shard_offset, s.bytes));
      }
    });
    return digests;
  }
  for (const auto i : owned) {  // from the device copy through host memory, segment by segment
    const auto& s = plan.job->segments[i];
    const auto h = hasher_.hash(copy.device.subspan(s.shard_offset, s.bytes), true);
    if (!h) {
      fail("cannot read the device copy of version " + std::to_string(copy.version) +
           " for its digests: " + h.error().message());
      return std::nullopt;
    }
    add(i, *h);
  }
  return digests;
}

void trainer_shard::start_sending(const update_go& go) {
  const auto generation = ++send_generation_;
  send_.meter().reset();
  retire_routes();
  changed();
  for (const auto& rc : go.routes) {
    auto r = std::make_shared<route>(rc.route, plan_->job->depth,
                                     static_cast<std::uint32_t>(plan_->job->shards.size()));
    r->version = go.version;
    r->generation = generation;
    r->plan = plan_;
    if (const auto p = plan_->paths.find(r->leader); p != plan_->paths.end()) r->path = p->second;
    for (auto id : rc.chunks) {
      if (plan_->job->chunks.at(id).shard == shard_) r->chunks.push_back(id);
    }
    // In send order, which is the offload's: every route of this shard, and every chain, takes
    // its chunks in one order.
    std::sort(r->chunks.begin(), r->chunks.end(), [&](std::uint32_t a, std::uint32_t b) {
      return plan_->send_position[a] < plan_->send_position[b];
    });
    // This shard's receive slots at a leader: `depth` of them, after the other shards'.
    for (std::uint32_t i = 0; !r->direct && i < plan_->job->depth; ++i)
      r->free.push_back(r->first_slot + shard_ * plan_->job->depth + i);
    routes_.push_back(r);
    routes_to_.emplace(r->leader, r.get());
  }
  routes_left_ = routes_.size();
  link_chains(go);
  advance_routes();
}

void trainer_shard::link_chains(const update_go& go) {
  if (plan_->job->shared_host_copies) return;  // nothing is written: every member reads in place
  const auto& job = *plan_->job;
  // (instance, chunk) -> (rank, route) of each member it goes to directly
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::vector<std::pair<std::uint32_t, route*>>>
      members;
  for (std::size_t i = 0; i < routes_.size(); ++i) {
    // A member that reads GPU to GPU reads every chunk it hears itself: nothing to relay to it.
    if (!routes_[i]->direct || routes_[i]->path == chunk_path::device_direct) continue;
    const auto instance = go.routes[i].route.instance;
    const auto inst = std::find_if(job.instances.begin(), job.instances.end(),
                                   [&](const instance_plan& p) { return p.id == instance; });
    if (inst == job.instances.end()) continue;
    const auto rank = static_cast<std::uint32_t>(
        std::find(inst->workers.begin(), inst->workers.end(), routes_[i]->leader) -
        inst->workers.begin());
    for (const auto id : routes_[i]->chunks)
      members[{instance, id}].emplace_back(rank, routes_[i].get());
  }
  for (auto& [key, heard_by] : members) {
    if (heard_by.size() < 2) continue;
    std::sort(heard_by.begin(), heard_by.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    auto link = std::make_shared<chain>();
    for (std::size_t n = 0; n < heard_by.size(); ++n) {
      auto* r = heard_by[n].second;
      if (n > 0) link->hops.push_back({.worker = r->leader, .slots = r->slots});
      link->routes.push_back(r);
      r->chained.emplace(key.second, std::pair{link, n});
    }
  }
}

void trainer_shard::advance(route& r) {
  if (r.advancing) {
    r.advance_again = true;
    return;
  }
  r.advancing = true;
  do {
    r.advance_again = false;
    advance_chunks(r);
  } while (r.advance_again);
  r.advancing = false;
}

bool trainer_shard::take_slot(route& r, std::uint32_t chunk) {
  if (!r.direct) {
    if (r.free.empty()) return false;
    r.slot = r.free.front();
    r.free.pop_front();
    return true;
  }
  chain* along = nullptr;
  std::size_t place = 0;
  if (const auto link = r.chained.find(chunk); link != r.chained.end()) {
    along = link->second.first.get();
    place = link->second.second;
    if (along->granted != place) return false;  // the members before it ask first
  }
  if (!r.asked) {
    send(r.leader, slot_request{.version = r.version, .chunk = chunk});
    r.asked = true;
  }
  const auto grant = r.grants.find(chunk);
  if (grant == r.grants.end()) return false;
  r.slot = grant->second;
  r.grants.erase(grant);
  if (along) {
    if (place > 0) {
      along->hops[place - 1].slot = *r.slot;
      along->hops[place - 1].offset = r.slot_offset(*r.slot, r.plan->job->chunk_bytes);
    }
    // The next member's turn; once every member has its slot, the first one's to write.
    ++along->granted;
    advance(*along->routes[along->granted < along->routes.size() ? along->granted : 0]);
  }
  return true;
}

void trainer_shard::next_chunk(route& r) {
  ++r.next;
  r.slot.reset();
  r.asked = false;
  r.checksum.reset();
  r.told_older_writes = false;
}

void trainer_shard::hash_stripe(route& r, std::span<const std::byte> stripe) {
  r.hashing = true;
  ++works_in_flight_;
  async_chunk_checksum(host().env(), stripe, [this, r = r.shared_from_this()](std::uint64_t sum) {
    --works_in_flight_;
    r->hashing = false;
    r->checksum = sum;
    advance(*r);
  });
}

void trainer_shard::advance_chunks(route& r) {
  const auto& job = *r.plan->job;
  // SEND: each chunk as soon as it is offloaded (or at once, from the host copy of an older
  // version).
  while (r.next < r.chunks.size() && current(r) && !r.hashing) {
    const auto id = r.chunks[r.next];
    // By chunk, not by place in the order: a plan of the same layout may order the chunks
    // otherwise (audiences change with membership) than the one the copy was offloaded under.
    const auto* copy = copies_.holding(r.version);
    if (!copy) return;
    if (copy->layout != job.layout) {
      // Offloaded under an older plan whose chunk ids meant other bytes: never send them as these.
      r.voided = true;
      return void_version(r.version);
    }
    // GPU to GPU where the device copy holds the chunk; else from the host copy (the worker is
    // reached through host memory, or the version was offloaded before the shard kept a device
    // copy).
    const bool device = r.path != chunk_path::host_copy && copy->in_device.at(id);
    if (!device && !copy->in_host.at(id)) return;
    if (!r.slot && !take_slot(r, id)) return;
    std::vector<relay_hop> relay;
    if (const auto link = r.chained.find(id); link != r.chained.end()) {
      const auto& [along, place] = link->second;
      if (place > 0) {  // the worker before this one in the chain writes it here
        next_chunk(r);
        continue;
      }
      if (along->granted < along->hops.size() + 1) return;
      relay = along->hops;
    }
    const auto& c = job.chunks[id];
    const auto part = stripe_of(c.bytes, r.stripes, r.stripe);
    const std::byte* bytes =
        (device ? copy->device : copy->host).data() + c.shard_offset + part.offset;
    auto sent = announce(r, *copy, id, device);
    sent.relay = std::move(relay);
    if (r.stripes > 1 && options_.checksums && !device) {
      if (!r.checksum) return hash_stripe(r, {bytes, part.bytes});
      sent.checksum = *r.checksum;
    }
    if (part.bytes == 0 ||
        sent.in_place()) {  // nothing to write (an empty stripe, or read in place)
      send(r.leader, sent);
      next_chunk(r);
      continue;
    }
    // After the older generations' writes to this leader (`older_writes_`); the transport ends
    // them at the latest when it gives the leader up.
    if (older_writes_.contains(r.leader)) {
      if (!r.told_older_writes) note("send waits for an older generation's writes");
      r.told_older_writes = true;
      return;
    }
    const auto slot = *r.slot;
    next_chunk(r);
    write_stripe(r, id, slot, {bytes, part.bytes}, part.offset, std::move(sent));
  }
  finish_if_done(r);
}

void trainer_shard::write_stripe(route& r, std::uint32_t id, std::uint32_t slot,
                                 std::span<const std::byte> stripe, std::uint64_t stripe_offset,
                                 chunk_sent sent) {
  const auto& job = *r.plan->job;
  ++r.in_flight;
  ++works_in_flight_;
  // The stripe lands at its offset in the slot, so that the leader's slot keeps the chunk's
  // layout, or at its start in a slot that holds the stripe alone.
  const auto at =
      r.slot_offset(slot, job.chunk_bytes) + (r.stripe_only(job.chunk_bytes) ? 0 : stripe_offset);
  send_.write(stripe, r.slots, at, make_imm(leader_slot_tag, epoch_imm_value(epoch(), slot)),
              r.version, id,
              [this, r = r.shared_from_this(), sent = std::move(sent)](std::error_code ec) {
                on_stripe_written(*r, sent, ec);
              });
}

void trainer_shard::on_stripe_written(route& r, const chunk_sent& sent, std::error_code ec) {
  --works_in_flight_;
  --r.in_flight;
  if (r.retired) older_write_ended(r.leader);
  if (!current(r)) return;
  if (ec == errc::not_same_host) {
    // No regroup mends that: the job is set up wrong.
    const auto why =
        fmt::format("cannot write to node {} with same-host copies: {}; use tcp or fabric",
                    r.leader.node, ec.message());
    send(coordinator_, participant_error{.reason = why});
    return fail(why);
  }
  if (ec) {
    // A dead leader is the coordinator's to detect; the regroup resends what is missing.
    log::warn("trainer shard {}: write of chunk {} to node {} failed: {}", shard_, sent.chunk,
              r.leader.node, ec.message());
    return;
  }
  send(r.leader, sent);
  finish_if_done(r);
}

chunk_sent trainer_shard::announce(const route& r, const shard_copies::version_copy& copy,
                                   std::uint32_t id, bool device) const {
  const auto& job = *r.plan->job;
  chunk_sent sent{.version = r.version,
                  .chunk = id,
                  .slot = *r.slot,
                  .checksum = copy.checksums[id],
                  .chunk_checksum = copy.checksums[id]};
  if (device) sent.checksum = 0;                        // no host byte to hash
  if (device && r.path == chunk_path::device_direct) {  // the leader copies its stripe GPU to GPU
    sent.device_source = copies_.device_ref();
  } else if (!device && job.shared_host_copies) {  // the leader reads its stripe in place
    sent.source = copies_.host_ref();
  }
  if (sent.in_place()) sent.source_offset = copy.offset + job.chunks[id].shard_offset;
  return sent;
}

void trainer_shard::finish_if_done(route& r) {
  if (r.finished || !current(r) || r.next < r.chunks.size() || r.in_flight > 0) return;
  r.finished = true;
  if (--routes_left_ == 0) {
    send(
        coordinator_,
        shard_sent{.shard = shard_, .version = r.version, .send_seconds = send_.meter().seconds()});
  }
}

}  // namespace ferry
