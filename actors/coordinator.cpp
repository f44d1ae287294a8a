#include "actors/coordinator.hpp"

#include <algorithm>
#include <utility>

#include "runtime/log.hpp"
#include "runtime/node.hpp"

namespace ferry {

namespace {
std::string worker_name(std::uint32_t instance, std::uint32_t rank) {
  return std::to_string(instance) + "." + std::to_string(rank);
}
}  // namespace

std::string_view regroup_cause_name(regroup_cause::kind k) {
  using enum regroup_cause::kind;
  switch (k) {
    case job_start:
      return "job_start";
    case trainer_joined:
      return "trainer_joined";
    case worker_joined:
      return "worker_joined";
    case link_lost:
      return "link_lost";
    case left:
      return "left";
    case silent:
      return "silent";
    case reported:
      return "reported";
    case version_failed:
      return "version_failed";
  }
  return "unknown";
}

std::string regroup_report::reason() const {
  std::string out;
  for (const auto& c : causes) out += (out.empty() ? "" : "; ") + c.text;
  return out;
}

template <message M>
void job_coordinator::handle(void (job_coordinator::*handler)(const envelope_header&, const M&)) {
  on<M>([this, handler](const envelope_header& h, const M& m) {
    members_.last_seen[h.from.node] = host().clock().now();
    if (!stopping_) (this->*handler)(h, m);
  });
}

job_coordinator::job_coordinator(node& host, actor_id id, job_shape shape)
    : actor(host, id), shape_(std::move(shape)) {
  handle(&job_coordinator::on_register_trainer);
  handle(&job_coordinator::on_register_worker);
  handle(&job_coordinator::on_worker_ready);
  handle(&job_coordinator::on_peer_unreachable);
  handle(&job_coordinator::on_heartbeat);
  handle(&job_coordinator::on_shard_update_failed);
  handle(&job_coordinator::on_leave_job);
  handle(&job_coordinator::on_publish_started);
  handle(&job_coordinator::on_shard_offloaded);
  handle(&job_coordinator::on_shard_sent);
  handle(&job_coordinator::on_shard_done);
  handle(&job_coordinator::on_version_complete);
  handle(&job_coordinator::on_participant_error);
  host.on_peer_lost([this](node_id peer, std::error_code why) {
    lost(peer, regroup_cause::kind::link_lost, "link lost: " + why.message());
  });
  watch_heartbeats();
}

job_coordinator::~job_coordinator() {
  stopping_ = true;
  if (distribution_) distribution_->cancelled = true;
  host().clock().cancel(heartbeat_timer_);
  for (const auto& [node, timer] : suspect_checks_) host().clock().cancel(timer);
  host().on_peer_lost({});
}

// ---- what members send -------------------------------------------------------------------

void job_coordinator::on_register_trainer(const envelope_header& h, const register_trainer& m) {
  if (m.shard >= shape_.trainers)
    return fail_job("trainer shard " + std::to_string(m.shard) + " is not part of the job");
  if (std::string why; !check_registration(m.tensors, shape_.limits, why)) {
    return fail_job("trainer shard " + std::to_string(m.shard) + " (node " +
                    std::to_string(h.from.node) + "): " + why);
  }
  if (auto it = members_.trainers.find(m.shard);
      it != members_.trainers.end() && it->second.who == h.from)
    return;  // sent again
  add_peer(h.from, m.transport_address);
  readmit(h.from);
  const bool replacing = members_.trainers.contains(m.shard);
  members_.trainers[m.shard] = {.who = h.from,
                                .transport_address = m.transport_address,
                                .tensors = m.tensors,
                                .place = m.place,
                                .first_version = started_ ? updates_.next_version() : 1};
  if (started_) {
    regroup({.what = regroup_cause::kind::trainer_joined,
             .node = h.from.node,
             .text = "trainer shard " + std::to_string(m.shard) +
                     (replacing ? " replaced" : " rejoined") + " (node " +
                     std::to_string(h.from.node) + ")"});
  } else if (members_.all_declared(shape_.trainers, shape_.instance_sizes)) {
    regroup({.what = regroup_cause::kind::job_start, .text = "job start"});
  }
}

void job_coordinator::on_register_worker(const envelope_header& h, const register_worker& m) {
  if (m.instance >= shape_.limits.max_instance_id) {
    return fail_job("worker " + worker_name(m.instance, m.rank) + ": instance ids are below " +
                    std::to_string(shape_.limits.max_instance_id) +
                    " (job_limits::max_instance_id)");
  }
  // A table equal to a live one passed this check when that one was registered.
  auto [table, fresh] = members_.intern(m.tensors, m.parts);
  if (std::string why; fresh && !check_registration(table->tensors.items(), shape_.limits, why)) {
    return fail_job("worker " + worker_name(m.instance, m.rank) + " (node " +
                    std::to_string(h.from.node) + "): " + why);
  }
  if (auto it = members_.workers.find({m.instance, m.rank});
      it != members_.workers.end() && it->second.who == h.from)
    return;  // sent again
  add_peer(h.from, m.transport_address);
  readmit(h.from);
  members_.workers[{m.instance, m.rank}] = {.who = h.from,
                                            .transport_address = m.transport_address,
                                            .table = std::move(table),
                                            .on_device = m.on_device,
                                            .place = m.place};
  if (started_) {
    const bool new_instance = !instances_seen_.contains(m.instance);
    regroup({.what = regroup_cause::kind::worker_joined,
             .node = h.from.node,
             .text = "worker " + worker_name(m.instance, m.rank) + " joined (node " +
                     std::to_string(h.from.node) + ")" + (new_instance ? ", a new instance" : "")});
  } else if (members_.all_declared(shape_.trainers, shape_.instance_sizes)) {
    regroup({.what = regroup_cause::kind::job_start, .text = "job start"});
  }
}

void job_coordinator::on_worker_ready(const envelope_header& h, const worker_ready& m) {
  auto it = members_.workers.find({m.instance, m.rank});
  if (it == members_.workers.end() || h.epoch != epoch() || it->second.who != h.from) return;
  if (std::string why;
      m.slots.length > 0 && !regions_.offer(h.from.node, h.epoch, m.slots, shape_.limits, why)) {
    return fail_job("worker " + worker_name(m.instance, m.rank) + ": " + why);
  }
  auto& w = it->second;
  w.ready = true;
  w.slots = m.slots.length > 0 ? std::optional(m.slots) : std::nullopt;
  w.direct_slot = m.direct_slot;
  w.slot_bytes = m.slot_bytes;
  w.complete_version = std::max(w.complete_version, m.complete_version);
  w.partial_version = m.partial_version;
  w.partial_chunks = {m.partial_chunks.begin(), m.partial_chunks.end()};
  if (members_.all_workers_ready()) plan_in_force();
}

void job_coordinator::on_peer_unreachable(const envelope_header& h, const peer_unreachable& m) {
  suspect(m.node, "unreachable from node " + std::to_string(h.from.node) + " (" + m.why + ")");
}

void job_coordinator::on_heartbeat(const envelope_header& h, const heartbeat&) {
  answer_given_up(h.from.node);
}

/// A trainer shard cannot send a version it offloaded in a layout that changed since.
void job_coordinator::on_shard_update_failed(const envelope_header& h, const update_failed& m) {
  const auto shard = members_.find_trainer(h.from);
  if (shard == members_.trainers.end() || m.version <= updates_.delivered() ||
      !updates_.pending().contains(m.version))
    return;
  fail_version(m.version, "trainer shard " + std::to_string(shard->first) + ": " + m.reason);
}

void job_coordinator::on_leave_job(const envelope_header& h, const leave_job& m) {
  lost(h.from.node, regroup_cause::kind::left, "left: " + m.reason);
  members_.given_up.erase(h.from.node);
}

void job_coordinator::on_publish_started(const envelope_header& h, const publish_started& m) {
  if (!from_shard(h, m.shard)) return;
  verdicts_.publish_started(m.version, this->host().clock().now());
  std::optional<std::uint32_t> publisher;  // none from a shard given up, whose frames a cut held
  if (const auto shard = members_.find_trainer(h.from); shard != members_.trainers.end()) {
    shard->second.last_published = std::max(shard->second.last_published, m.version);
    publisher = shard->first;
  }
  updates_.published(m.version, publisher);
  fail_skipped_versions();
  resume();
}

void job_coordinator::on_shard_offloaded(const envelope_header& h, const shard_offloaded& m) {
  if (from_shard(h, m.shard)) verdicts_.offloaded(m);
}

void job_coordinator::on_shard_sent(const envelope_header& h, const shard_sent& m) {
  if (from_shard(h, m.shard)) verdicts_.sent(m);
}

void job_coordinator::on_shard_done(const envelope_header& h, const shard_done& m) {
  if (!from_shard(h, m.shard)) return;
  verdicts_.shard_finished(m);
  check_complete();
}

void job_coordinator::on_version_complete(const envelope_header& h, const version_complete& m) {
  auto it = members_.workers.find({m.instance, m.rank});
  if (it == members_.workers.end() || it->second.who != h.from) return;
  it->second.complete_version = std::max(it->second.complete_version, m.version);
  verdicts_.worker_finished(m);
  check_complete();
}

void job_coordinator::on_participant_error(const envelope_header& h, const participant_error& m) {
  fail_job("node " + std::to_string(h.from.node) + ": " + m.reason);
}

void job_coordinator::add_peer(address who, const std::string& transport_address) {
  if (auto ec = host().transport().add_peer(who.node, transport_address)) {
    log::warn("coordinator: cannot reach node {} at '{}': {}", who.node, transport_address,
              ec.message());
  }
}

void job_coordinator::watch_heartbeats() {
  heartbeat_timer_ =
      host().clock().async_wait(shape_.heartbeat_timeout / 4, [this](std::error_code ec) {
        if (ec || stopping_) return;
        const auto silent = members_.silent(host().clock().now(), shape_.heartbeat_timeout);
        for (auto n : silent)
          lost(n, regroup_cause::kind::silent,
               "no heartbeat for " + std::to_string(shape_.heartbeat_timeout.count()) + " ms");
        watch_heartbeats();
      });
}

void job_coordinator::suspect(node_id node, const std::string& why, bool checked_again) {
  if (stopping_ || failed_ || !members_.is_member(node) ||
      (!checked_again && suspect_checks_.contains(node)))
    return;
  const auto enough = std::chrono::duration_cast<clock::duration>(shape_.heartbeat_timeout / 4);
  const auto silent = host().clock().now() - members_.last_seen[node];
  if (silent >= enough) {
    return lost(
        node, regroup_cause::kind::reported,
        "reported " + why + ", and silent for " +
            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(silent).count()) +
            " ms");
  }
  if (checked_again) return;
  suspect_checks_[node] =
      host().clock().async_wait(enough - silent, [this, node, why](std::error_code ec) {
        if (ec) return;  // cancelled: this coordinator may be gone
        suspect_checks_.erase(node);
        suspect(node, why, true);
      });
}

void job_coordinator::answer_given_up(node_id node) {
  auto it = members_.given_up.find(node);
  if (it == members_.given_up.end()) return;
  const auto& g = it->second;
  bool replaced = false;
  if (g.shard) replaced = members_.trainers.contains(*g.shard);
  if (g.worker) replaced = members_.workers.contains(*g.worker);
  add_peer(g.who, g.transport_address);
  send(g.who, register_again{.replaced = replaced});
  if (replaced) members_.given_up.erase(it);
}

void job_coordinator::readmit(const address& who) {
  auto it = members_.given_up.find(who.node);
  if (it == members_.given_up.end()) return;
  for (const auto v : updates_.failed()) {
    if (v > it->second.delivered)
      send(who, update_failed{.version = v, .reason = "failed while this member was cut off"});
  }
  members_.given_up.erase(it);
}

void job_coordinator::lost(node_id node, regroup_cause::kind what, const std::string& why) {
  if (stopping_ || failed_) return;
  // A replacement comes with a node id of its own: what was kept per node would only grow.
  regions_.forget(node);
  members_.last_seen.erase(node);
  for (auto it = members_.trainers.begin(); it != members_.trainers.end(); ++it)
    if (it->second.who.node == node) return lose_trainer(it->first, what, why);
  for (auto it = members_.workers.begin(); it != members_.workers.end(); ++it)
    if (it->second.who.node == node) return lose_worker(it->first, what, why);
}

void job_coordinator::lose_trainer(std::uint32_t shard, regroup_cause::kind what,
                                   const std::string& why) {
  const auto it = members_.trainers.find(shard);
  const auto node = it->second.who.node;
  members_.give_up(node, {.who = it->second.who,
                          .transport_address = it->second.transport_address,
                          .shard = shard,
                          .worker = {},
                          .delivered = updates_.delivered()});
  members_.trainers.erase(it);
  host().transport().remove_peer(node);
  const auto reason =
      "trainer shard " + std::to_string(shard) + " (node " + std::to_string(node) + ") " + why;
  if (const auto active = updates_.active()) {
    const auto v = active->version;
    log::error("coordinator: update of version {} failed: {}", v, reason);
    if (!active->catch_up) updates_.fail(v);
    broadcast_all([&] { return update_failed{.version = v, .reason = reason}; });
    abandon_active();
    if (on_update_failed) on_update_failed(v, reason);
  }
  // Versions published but not yet sent can no longer complete either (a shard that comes back
  // has no copy of them): say so to everyone waiting for them.
  for (const auto v : updates_.pending()) fail_version(v, reason);
  regroup({.what = what, .node = node, .text = reason});
}

void job_coordinator::lose_worker(worker_key worker, regroup_cause::kind what,
                                  const std::string& why) {
  const auto it = members_.workers.find(worker);
  const auto node = it->second.who.node;
  const auto [instance, rank] = worker;
  members_.give_up(node, {.who = it->second.who,
                          .transport_address = it->second.transport_address,
                          .shard = {},
                          .worker = it->first,
                          .delivered = updates_.delivered()});
  const auto& active = updates_.active();
  if (active && plan_ && leads(it->second.who)) ++leaders_lost_mid_update_;
  const bool held_active = active && it->second.complete_version >= active->version;
  members_.workers.erase(it);
  host().transport().remove_peer(node);
  // A worker that leaves holding the update takes nothing from it: if every other worker holds it
  // too (or none is left), it is delivered, even mid-regroup (a job's last workers may all leave
  // right after the last version, before a new plan could be in force). Nothing new starts on the
  // old plan: the regroup below makes the next.
  if (held_active && plan_ && holds_everywhere(active->version)) {
    in_force_ = false;
    complete_active(*plan_);
  } else if (held_active && plan_ && members_.workers.empty()) {
    // The last to leave, before every shard reported: the shards' reports complete it. No
    // worker is left to plan for.
    left_holding_ = held_by_departed{.version = active->version, .under = std::move(*plan_)};
    plan_.reset();
  }
  regroup({.what = what,
           .node = node,
           .text = "worker " + worker_name(instance, rank) + " (node " + std::to_string(node) +
                   ") " + why});
}

bool job_coordinator::from_shard(const envelope_header& h, std::uint32_t shard) {
  const auto it = members_.trainers.find(shard);
  if (it != members_.trainers.end() && it->second.who == h.from) return true;
  // Given up, its frames held by a cut link: what it reports is still its own.
  const auto gone = members_.given_up.find(h.from.node);
  if (gone != members_.given_up.end() && gone->second.who == h.from && gone->second.shard == shard)
    return true;
  log::warn("coordinator: dropped trainer shard {}'s report from node {}, which is not that shard",
            shard, h.from.node);
  note("shard report not from its shard");
  return false;
}

std::vector<node_id> job_coordinator::leader_nodes() const {
  std::vector<node_id> nodes;
  for (const auto& inst : plan_->instances) {
    for (auto rank : inst.leaders) nodes.push_back(inst.workers.at(rank).node);
  }
  return nodes;
}

bool job_coordinator::leads(const address& worker) const {
  return std::any_of(
      plan_->instances.begin(), plan_->instances.end(), [&](const instance_plan& inst) {
        return std::any_of(inst.leaders.begin(), inst.leaders.end(),
                           [&](auto rank) { return inst.workers.at(rank) == worker; });
      });
}

void job_coordinator::regroup(regroup_cause cause) {
  if (failed_) return;
  if (!regroup_since_) regroup_since_ = host().clock().now();
  in_force_ = false;
  set_epoch(epoch() + 1);
  if (distribution_)
    distribution_->cancelled = true;  // the old plan must not go out stamped with the new epoch
  log::info("coordinator: epoch {}: {}", epoch(), cause.text);
  regroup_causes_.push_back(std::move(cause));
  if (members_.trainers.size() < shape_.trainers) {
    log::warn("coordinator: waiting for {} trainer shard(s) to rejoin before publishing again",
              shape_.trainers - members_.trainers.size());
    return;
  }
  auto in = plan_inputs_now();
  if (!in) return;
  if (in->instances.empty()) {
    log::warn("coordinator: no rollout worker left; waiting for one to join");
    plan_.reset();
    return;
  }
  std::string why;
  auto p = make_plan(*in, why);
  if (!p) return fail_job("no plan: " + why);
  adopt_plan(std::move(*p));
}

std::optional<plan_inputs> job_coordinator::plan_inputs_now() {
  // The coverage of a partial registration is checked once every declared member is in: at start.
  plan_inputs in{.epoch = epoch(),
                 .chunk_bytes = shape_.chunk_bytes,
                 .depth = shape_.depth,
                 .require_coverage = shape_.require_coverage && !started_,
                 .limits = shape_.limits,
                 .shared_host_copies = shape_.shared_host_copies,
                 .p2p = shape_.p2p};
  std::vector<tensor_spec> published;
  for (const auto& [rank, t] : members_.trainers) {
    in.shards.push_back(t.who);
    in.shard_tensors.push_back(t.tensors);
    in.shard_places.push_back(t.place);
    published.insert(published.end(), t.tensors.begin(), t.tensors.end());
  }
  const published_tensors by_name(published);
  std::string why;
  std::map<const job_membership::worker_table*, shared_selection>
      checked;  // each distinct table once
  for (const auto& [key, w] : members_.workers) {
    const auto [it, fresh] = checked.try_emplace(w.table.get());
    if (fresh) {
      selection s;
      if (!check_worker_tensors(by_name, w.table->tensors.items(), w.table->parts.items(), s,
                                why)) {
        fail_job("worker " + worker_name(key.first, key.second) + ": " + why);
        return std::nullopt;
      }
      if (!s.empty()) it->second = intern(selections_, std::move(s));
    }
    if (it->second) in.selected.emplace(w.who, it->second);
  }
  in.selections = selections_;
  in.instances = instances_now();
  return in;
}

/// Every instance some worker registered in, declared or joined since; one whose workers all left
/// has none and drops out of the plan. An instance keeps its first leader where it can.
std::vector<instance_plan> job_coordinator::instances_now() {
  std::vector<instance_plan> instances;
  for (auto first = members_.workers.begin(); first != members_.workers.end();) {
    const std::uint32_t i = first->first.first;
    const auto end = members_.workers.lower_bound({i + 1, 0});
    instance_plan inst{.id = i};
    bool on_devices = true;
    for (auto w = first; w != end; ++w) {
      inst.workers.push_back(w->second.who);
      inst.places.push_back(w->second.place);
      on_devices = on_devices && w->second.on_device;
    }
    first = end;
    std::optional<address> first_leader;
    for (std::size_t o = 0; plan_ && o < plan_->instances.size(); ++o) {
      const auto& old = plan_->instances[o];
      if (old.id == i) first_leader = old.workers.at(old.leaders.at(0));
    }
    inst.leaders = choose_leaders(inst.workers, shape_.stripes, on_devices, first_leader);
    instances_seen_.insert(i);
    instances.push_back(std::move(inst));
  }
  return instances;
}

/// The new plan goes out to every member; where its chunk layout differs from the last, the
/// versions laid out for the old one fail.
void job_coordinator::adopt_plan(plan p) {
  if (layout_ && *layout_ != p.layout) {
    // Chunk ids now mean other bytes: what is in flight, and the trainers' host copies, were laid
    // out for the old ones. Those versions fail; late joiners wait for the next version.
    const std::string relaid =
        "the chunk layout changed (a trainer's table, or a part no worker had registered)";
    log::warn("coordinator: epoch {}: {}", epoch(), relaid);
    abandon_active();
    for (const auto v : std::vector(updates_.pending().begin(), updates_.pending().end()))
      fail_version(v, relaid, true);
    for (auto& [shard, t] : members_.trainers)
      t.first_version = std::max(t.first_version, updates_.next_version());
  }
  layout_ = p.layout;
  plan_ = std::move(p);
  started_ = true;
  std::vector<peer_entry> peers;
  for (const auto& [rank, t] : members_.trainers)
    peers.push_back({t.who.node, t.transport_address});
  for (auto& [key, w] : members_.workers) {
    peers.push_back({w.who.node, w.transport_address});
    w.ready = false;
  }
  const auto pairs = plan_->paths();
  log::info(
      "coordinator: plan of epoch {}: {} tensors, {} chunks of up to {} bytes, {} bytes, {} "
      "instance(s), {} worker(s), "
      "{} leader(s) in instance {}; of {} trainer-worker pairs, {} GPU to GPU on one host, {} "
      "GPUDirect (p2p {})",
      epoch(), plan_->tensors.size(), plan_->chunks.size(), plan_->chunk_bytes,
      plan_->total_bytes(), plan_->instances.size(), members_.workers.size(),
      plan_->instances.front().leaders.size(), plan_->instances.front().id, pairs.all,
      pairs.device_direct, pairs.gpudirect, p2p_mode_name(plan_->p2p));
  send_plan(plan_ready{.plan = *plan_, .peers = peers});
}

void job_coordinator::fail_job(const std::string& reason) {
  if (failed_) return;
  failed_ = true;
  log::error("coordinator: job failed: {}", reason);
  broadcast_all([&] { return job_failed{.reason = reason}; });
  if (on_failed) on_failed(reason);
}

void job_coordinator::stop_job() {
  stopping_ = true;
  host().expect_departures();
  broadcast_all([] { return job_stop{.reason = "the job is over"}; });
}

}  // namespace ferry
