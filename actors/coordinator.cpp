#include "actors/coordinator.hpp"

#include <numeric>

#include "runtime/log.hpp"
#include "runtime/node.hpp"

namespace ferry {

coordinator::coordinator(node& host, actor_id id, job_shape shape) : actor(host, id), shape_(std::move(shape)) {
  on<register_trainer>([this](const envelope_header& h, const register_trainer& m) {
    if (m.shard >= shape_.trainers) return fail_job("trainer shard " + std::to_string(m.shard) + " is not part of the job");
    add_peer(h.from, m.transport_address);
    trainers_[m.shard] = {h.from, m.transport_address, m.tensors};
    try_plan();
  });
  on<register_worker>([this](const envelope_header& h, const register_worker& m) {
    if (m.instance >= shape_.instance_sizes.size() || m.rank >= shape_.instance_sizes[m.instance]) {
      return fail_job("worker " + std::to_string(m.instance) + "." + std::to_string(m.rank) + " is not part of the job");
    }
    add_peer(h.from, m.transport_address);
    workers_[{m.instance, m.rank}] = {h.from, m.transport_address, m.tensors, std::nullopt, false};
    try_plan();
  });
  on<worker_ready>([this](const envelope_header&, const worker_ready& m) {
    auto it = workers_.find({m.instance, m.rank});
    if (it == workers_.end()) return;
    it->second.ready = true;
    if (m.slots.length > 0) it->second.slots = m.slots;
    try_ready();
  });
  on<publish_started>([this](const envelope_header&, const publish_started& m) {
    auto [it, fresh] = versions_.try_emplace(m.version);
    if (fresh) it->second.started = std::chrono::steady_clock::now();
  });
  on<shard_offloaded>([this](const envelope_header&, const shard_offloaded& m) {
    auto& v = versions_[m.version];
    v.offloaded_seconds = std::max(v.offloaded_seconds.value_or(0), m.seconds);
  });
  on<shard_done>([this](const envelope_header&, const shard_done& m) {
    auto& v = versions_[m.version];
    ++v.shards_offloaded;
    for (const auto& d : m.digests) v.trainer_digests[d.tensor] = d;
    v.busy.offload = std::max(v.busy.offload, m.busy.offload);
    v.busy.send = std::max(v.busy.send, m.busy.send);
    check_delivered(m.version);
  });
  on<version_complete>([this](const envelope_header&, const version_complete& m) {
    auto& v = versions_[m.version];
    ++v.complete;
    v.busy.upload = std::max(v.busy.upload, m.busy.upload);
    v.busy.broadcast = std::max(v.busy.broadcast, m.busy.broadcast);
    v.busy.apply = std::max(v.busy.apply, m.busy.apply);
    // Digests are compared once the trainers' arrived; keep the worker's until then.
    pending_digests_[m.version].push_back(m.digests);
    check_delivered(m.version);
  });
  on<participant_error>([this](const envelope_header& h, const participant_error& m) {
    fail_job("node " + std::to_string(h.from.node) + ": " + m.reason);
  });
}

std::uint32_t coordinator::worker_count() const {
  return std::accumulate(shape_.instance_sizes.begin(), shape_.instance_sizes.end(), 0u);
}

void coordinator::add_peer(address who, const std::string& transport_address) {
  if (auto ec = host().transport().add_peer(who.node, transport_address)) {
    log::warn("coordinator: cannot reach node {} at '{}': {}", who.node, transport_address, ec.message());
  }
}

void coordinator::broadcast_all(auto make) {
  for (const auto& [rank, t] : trainers_) send(t.who, make());
  for (const auto& [key, w] : workers_) send(w.who, make());
}

void coordinator::fail_job(const std::string& reason) {
  if (failed_) return;
  failed_ = true;
  log::error("coordinator: job failed: {}", reason);
  broadcast_all([&] { return job_failed{.reason = reason}; });
  if (on_failed) on_failed(reason);
}

void coordinator::try_plan() {
  if (plan_ || failed_ || trainers_.size() < shape_.trainers || workers_.size() < worker_count()) return;
  plan_inputs in{.epoch = 1, .chunk_bytes = shape_.chunk_bytes, .depth = shape_.depth};
  for (const auto& [rank, t] : trainers_) {
    in.shards.push_back(t.who);
    in.shard_tensors.push_back(t.tensors);
  }
  for (std::uint32_t i = 0; i < shape_.instance_sizes.size(); ++i) {
    instance_plan inst{.id = i};
    for (std::uint32_t r = 0; r < shape_.instance_sizes[i]; ++r) inst.workers.push_back(workers_.at({i, r}).who);
    in.instances.push_back(std::move(inst));
  }
  std::string why;
  auto p = make_plan(in, why);
  if (!p) return fail_job("no plan: " + why);
  for (const auto& [key, w] : workers_) {
    if (!check_worker_tensors(*p, w.tensors, why)) {
      return fail_job("worker " + std::to_string(key.first) + "." + std::to_string(key.second) + ": " + why);
    }
  }
  plan_ = std::move(*p);
  std::vector<peer_entry> peers;
  for (const auto& [rank, t] : trainers_) peers.push_back({t.who.node, t.transport_address});
  for (const auto& [key, w] : workers_) peers.push_back({w.who.node, w.transport_address});
  set_epoch(plan_->epoch);
  log::info("coordinator: plan of epoch {}: {} tensors, {} chunks of up to {} bytes, {} bytes in all", plan_->epoch,
            plan_->tensors.size(), plan_->chunks.size(), plan_->chunk_bytes, plan_->total_bytes());
  broadcast_all([&] { return plan_ready{.plan = *plan_, .peers = peers}; });
}

void coordinator::try_ready() {
  if (ready_ || failed_ || !plan_) return;
  for (const auto& [key, w] : workers_) {
    if (!w.ready) return;
  }
  job_ready routes;
  for (const auto& inst : plan_->instances) {
    for (auto leader_rank : inst.leaders) {
      const auto& w = workers_.at({inst.id, leader_rank});
      if (!w.slots) return fail_job("leader " + std::to_string(inst.id) + "." + std::to_string(leader_rank) + " offered no slots");
      routes.routes.push_back({.instance = inst.id, .leader = w.who, .slots = *w.slots});
    }
  }
  ready_ = true;
  for (const auto& [rank, t] : trainers_) send(t.who, routes);
  if (on_ready) on_ready(*plan_);
}

void coordinator::check_delivered(std::uint64_t version) {
  auto& v = versions_[version];
  if (failed_ || v.complete < worker_count() || v.shards_offloaded < shape_.trainers) return;
  const bool verify = !v.trainer_digests.empty();
  bool match = verify && v.trainer_digests.size() == plan_->tensors.size();
  for (const auto& digests : pending_digests_[version]) {
    if (digests.size() != plan_->tensors.size()) match = false;
    for (const auto& d : digests) {
      auto it = v.trainer_digests.find(d.tensor);
      if (it == v.trainer_digests.end() || !(it->second == d)) {
        match = false;
        log::error("coordinator: version {}: tensor '{}' differs on a worker", version,
                   d.tensor < plan_->tensors.size() ? plan_->tensors[d.tensor].name : "?");
      }
    }
  }
  pending_digests_.erase(version);
  version_report report{.version = version,
                        .bytes = plan_->total_bytes(),
                        .seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - v.started).count(),
                        .offloaded_seconds = v.offloaded_seconds.value_or(0),
                        .busy = v.busy,
                        .workers = worker_count(),
                        .verified = match};
  for (const auto& [rank, t] : trainers_) send(t.who, version_delivered{.version = version, .verified = match});
  versions_.erase(version);
  if (on_delivered) on_delivered(report);
}

void coordinator::stop_job() { broadcast_all([] { return job_stop{}; }); }

}  // namespace ferry
