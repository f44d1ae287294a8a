#include "actors/job_member.hpp"

#include <algorithm>

#include "runtime/log.hpp"
#include "runtime/node.hpp"

namespace ferry {

job_member::job_member(node& host, actor_id id, address coordinator,
                       std::chrono::milliseconds heartbeat_interval)
    : actor(host, id), coordinator_(coordinator), heartbeat_interval_(heartbeat_interval) {
  on_coordinator<job_failed>(
      [this](const envelope_header&, const job_failed& m) { fail(m.reason); });
  on_coordinator<job_stop>([this](const envelope_header&, const job_stop&) {
    const bool failed_before = failed_;
    stop_member();
    if (on_job_end && !failed_before) on_job_end();
  });
  peer_watch_ = host.watch_peers([this](node_id peer, std::error_code why) {
    if (stopped_ || failed_) return;
    if (peer == coordinator_.node) return lost_coordinator(why);
    send(coordinator_, peer_unreachable{.node = peer, .why = why.message()});
  });
  on_coordinator<register_again>([this](const envelope_header&, const register_again& m) {
    // Heartbeats held up by the cut arrive together, each answered: register once.
    if (stopped_ || failed_ || !send_registration_ || registering_) return;
    if (m.replaced)
      return fail(
          "another process took this member's place while its link to the coordinator was cut");
    log::warn("{}: the coordinator had given it up (a cut link); registering again", name());
    register_now();
  });
}

job_member::~job_member() {
  host().unwatch_peers(peer_watch_);
  host().clock().cancel(heartbeat_timer_);
  host().clock().cancel(grace_timer_);
}

void job_member::dropped_not_from_coordinator(const envelope_header& h, msg_kind kind) {
  log::warn(
      "{}: dropped a message of kind {} from node {}: only the coordinator (node {}) sends it",
      name(), kind, h.from.node, coordinator_.node);
  note("order not from the coordinator");
}

void job_member::register_now() {
  registering_ = true;
  since_registration_ = {};
  send_registration_();
}

void job_member::lost_coordinator(std::error_code why) {
  if (grace_timer_) return;
  grace_timer_ = host().clock().async_wait(coordinator_grace,
                                           [this, why, before = admissions_](std::error_code ec) {
                                             if (ec) return;  // cancelled: this member may be gone
                                             grace_timer_ = 0;
                                             if (!stopped_ && !failed_ && admissions_ == before)
                                               fail("lost the coordinator: " + why.message());
                                           });
}

void job_member::link_to(const std::vector<peer_entry>& peers) {
  auto& transport = host().transport();
  std::vector<node_id> members;
  members.reserve(peers.size());
  for (const auto& p : peers) {
    if (p.node == host().id()) continue;
    transport.add_peer(p.node, p.address);
    members.push_back(p.node);
  }
  std::ranges::sort(members);
  // Where writes are not tracked, a removal would report a trainer's write failed while the
  // provider may still carry it, and end the trainer's wait for its older writes early.
  if (transport.tracks_writes()) {
    for (const auto node : linked_)
      if (node != coordinator_.node && !std::ranges::binary_search(members, node))
        transport.remove_peer(node);
  }
  linked_ = std::move(members);
}

void job_member::leave(const std::string& reason) {
  send(coordinator_, leave_job{.reason = reason});
  stop_member();
}

void job_member::stop_member() {
  stopped_ = true;
  host().expect_departures();
  host().clock().cancel(heartbeat_timer_);
  halting();
  changed();
}

void job_member::fail(const std::string& reason) {
  if (failed_) return;
  failed_ = true;
  log::error("{}: {}", name(), reason);
  halting();
  changed();
  if (on_failed) on_failed(reason);
}

void job_member::fail_job(const std::string& reason) {
  send(coordinator_, participant_error{.reason = name() + ": " + reason});
  fail(reason);
}

void job_member::beat() {
  heartbeat_timer_ = host().clock().async_wait(heartbeat_interval_, [this](std::error_code ec) {
    if (ec || stopped_ || failed_) return;
    send(coordinator_, heartbeat{});
    since_registration_ += heartbeat_interval_;
    if (registering_ && since_registration_ >= registration_wait_) {
      send_registration_();
      since_registration_ = {};
      registration_wait_ = std::min(registration_wait_ * 2, std::chrono::milliseconds(8000));
    }
    beat();
  });
}

}  // namespace ferry
