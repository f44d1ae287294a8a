// The coordinator's updates: a plan on its way to the members and in force, the routes the
// trainers write along, an update started, completed or failed. Membership and regrouping are in
// coordinator.cpp.
#include <algorithm>

#include "actors/coordinator.hpp"
#include "runtime/log.hpp"
#include "runtime/node.hpp"

namespace ferry {
namespace {

double ms_between(clock::time_point from, clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

}  // namespace

void job_coordinator::fail_version(std::uint64_t version, const std::string& reason, bool relaid) {
  if (!updates_.fail(version)) return;
  log::error("coordinator: update of version {} failed: {}", version, reason);
  broadcast_all(
      [&] { return update_failed{.version = version, .reason = reason, .relaid = relaid}; });
  if (on_update_failed) on_update_failed(version, reason);
  if (const auto& active = updates_.active();
      active && active->version == version && !active->catch_up) {
    // Abandoned mid-update: a new epoch keeps its writes still in flight out of the next one's
    // slots.
    abandon_active();
    regroup({.what = regroup_cause::kind::version_failed,
             .text = "version " + std::to_string(version) + " failed"});
  }
}

void job_coordinator::fail_skipped_versions() {
  for (const auto& s : updates_.skipped(members_)) {
    fail_version(s.version, "trainer shard " + std::to_string(s.shard) + " published version " +
                                std::to_string(s.shard_published) + " without it");
  }
}

std::optional<std::vector<leader_route>> job_coordinator::leader_routes(const instance_plan& inst) {
  std::vector<leader_route> routes;
  const auto stripes = static_cast<std::uint32_t>(inst.leaders.size());
  for (std::uint32_t s = 0; s < stripes; ++s) {
    const auto leader = inst.workers.at(inst.leaders[s]);
    const auto* w = members_.find_worker(leader);
    if (!w || !w->slots) {
      fail_job("leader " + std::to_string(leader.node) + " of instance " + std::to_string(inst.id) +
               " offered no receive slots");
      return std::nullopt;
    }
    routes.push_back({.instance = inst.id,
                      .leader = leader,
                      .slots = *w->slots,
                      .stripe = s,
                      .stripes = stripes,
                      .slot_bytes = w->slot_bytes});
  }
  return routes;
}

std::optional<leader_route> job_coordinator::direct_route(std::uint32_t instance,
                                                          const address& worker) {
  const auto* w = members_.find_worker(worker);
  if (!w || !w->slots) {
    fail_job("worker " + std::to_string(worker.node) + " of instance " + std::to_string(instance) +
             " offered no slots for the chunks sent to it directly");
    return std::nullopt;
  }
  return leader_route{.instance = instance,
                      .leader = worker,
                      .slots = *w->slots,
                      .first_slot = w->direct_slot,
                      .direct = true,
                      .slot_bytes = w->slot_bytes};
}

void job_coordinator::send_plan(plan_ready message) {
  if (distribution_)
    distribution_->cancelled = true;  // the older plan's members not reached yet never will be
  distribution_ = std::make_shared<plan_distribution>();
  distribution_->message = encode_body(std::move(message));
  // Trainers first: each must hold the plan before its job_ready, which follows the workers'
  // readiness.
  members_.for_each([&](const address& who) { distribution_->to.push_back(who); });
  send_more_plans(distribution_);
}

void job_coordinator::send_more_plans(const std::shared_ptr<plan_distribution>& d) {
  constexpr std::uint32_t in_flight = 8;
  while (!d->cancelled && d->in_flight < in_flight && !d->to.empty()) {
    const auto who = d->to.front();
    d->to.pop_front();
    ++d->in_flight;
    send(who, d->message, [this, d](std::error_code) {
      --d->in_flight;
      if (!d->cancelled) send_more_plans(d);
    });
  }
  if (!d->cancelled && d->to.empty() && members_.all_workers_ready()) plan_in_force();
}

void job_coordinator::plan_in_force() {
  if (in_force_ || !plan_ || plan_->epoch != epoch() ||
      (distribution_ && !distribution_->to.empty()))
    return;
  job_ready ready{.next_version = updates_.next_version()};
  for (const auto& inst : plan_->instances) {
    auto routes = leader_routes(inst);
    if (!routes) return;
    ready.routes.insert(ready.routes.end(), routes->begin(), routes->end());
  }
  in_force_ = true;
  for (const auto& [rank, t] : members_.trainers) send(t.who, ready);
  if (regroup_since_) {
    const regroup_report r{.epoch = epoch(),
                           .milliseconds = ms_between(*regroup_since_, host().clock().now()),
                           .causes = std::exchange(regroup_causes_, {}),
                           .leaders_lost_mid_update = std::exchange(leaders_lost_mid_update_, 0),
                           .leaders = leader_nodes()};
    regroup_since_.reset();
    if (epoch() > 1) {
      ++regroups_;
      log::info("coordinator: regrouped into epoch {} in {:.1f} ms ({})", r.epoch, r.milliseconds,
                r.reason());
      if (on_regroup) on_regroup(r);
    } else if (on_ready) {
      on_ready(*plan_);
    }
  }
  if (const auto active = updates_.active())
    return start_update(*active);  // resend what is missing
  resume();
}

void job_coordinator::resume() {
  // One update at a time; an active one is resent (what is missing) only by a new plan, whose
  // epoch keeps stale writes of the old sends out of the slots.
  if (!in_force_ || failed_) return;
  if (const auto next = updates_.next(members_)) start_update(*next);
}

void job_coordinator::start_update(update_scheduler::update u) {
  updates_.start(u);
  std::vector<route_chunks> all;
  for (const auto& inst : plan_->instances) {
    auto sends = update_scheduler::what_travels(*plan_, inst, members_, u.version);
    auto routes = leader_routes(inst);
    if (!routes) return;
    if (!sends.through_leaders.empty()) {
      for (const auto& route : *routes)
        all.push_back({.route = route, .chunks = sends.through_leaders});
    }
    for (std::uint32_t r = 0; r < sends.direct.size(); ++r) {
      if (sends.direct[r].empty()) continue;
      auto route = direct_route(inst.id, inst.workers[r]);
      if (!route) return;
      all.push_back({.route = *route, .chunks = std::move(sends.direct[r])});
    }
  }
  const auto go = update_scheduler::orders_by_shard(*plan_, u.version, all);
  log::debug("coordinator: epoch {}: {} version {} to {} route(s)", epoch(),
             u.catch_up ? "catch-up of" : "update", u.version, all.size());
  for (const auto& [rank, t] : members_.trainers)
    if (rank < go.size()) send(t.who, go[rank]);
  if (on_update) on_update(u.version, u.catch_up, leader_nodes());
  check_complete();
}

void job_coordinator::check_complete() {
  const auto& active = updates_.active();
  if (!active || failed_ || !holds_everywhere(active->version)) return;
  // Under a plan in force; mid-regroup the new plan resends what is missing and checks again
  // (plan_in_force). Except where the job's last workers all left holding it: no plan comes.
  if (in_force_) return complete_active(*plan_);
  if (left_holding_ && left_holding_->version == active->version && members_.workers.empty()) {
    const auto held = std::exchange(left_holding_, std::nullopt);
    complete_active(held->under);
  }
}

bool job_coordinator::holds_everywhere(std::uint64_t version) const {
  if (!updates_.active()->catch_up && !verdicts_.shards_in(version, shape_.trainers))
    return false;  // digests, busy times to come
  return std::all_of(members_.workers.begin(), members_.workers.end(),
                     [&](const auto& w) { return w.second.complete_version >= version; });
}

void job_coordinator::abandon_active() {
  updates_.abandon();
  left_holding_.reset();
}

void job_coordinator::complete_active(const plan& p) {
  const bool match = verdicts_.digests_match(
      updates_.active()->version, p, [this](std::uint32_t instance, std::uint32_t rank) {
        const auto it = members_.workers.find({instance, rank});
        return it == members_.workers.end() ? std::optional<address>() : it->second.who;
      });
  const auto done = updates_.complete();
  left_holding_.reset();
  if (done.catch_up) {
    log::info("coordinator: late joiner(s) caught up with version {}{}", done.version,
              match ? ", digests match" : "");
  } else {
    const auto report =
        verdicts_.deliver(done.version, p, static_cast<std::uint32_t>(members_.workers.size()),
                          match, host().clock().now());
    for (const auto& [rank, t] : members_.trainers)
      send(t.who, version_delivered{.version = done.version, .verified = match});
    if (on_delivered) on_delivered(report);
  }
  resume();
}

}  // namespace ferry
