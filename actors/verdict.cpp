#include "actors/verdict.hpp"

#include <algorithm>

#include "runtime/log.hpp"

namespace ferry {

void version_verdicts::publish_started(std::uint64_t version, clock::time_point at) {
  auto& v = versions_[version];
  if (!v.started) v.started = at;
}

void version_verdicts::offloaded(const shard_offloaded& m) {
  auto& v = versions_[m.version];
  v.offloaded_seconds = std::max(v.offloaded_seconds, m.seconds);
}

void version_verdicts::sent(const shard_sent& m) {
  auto& v = versions_[m.version];
  v.busy.send = std::max(v.busy.send, m.send_seconds);
}

void version_verdicts::shard_finished(const shard_done& m) {
  auto& v = versions_[m.version];
  ++v.shards_done;
  for (const auto& d : m.digests) v.trainer_digests[d.segment] = d;
  v.busy.offload = std::max(v.busy.offload, m.busy.offload);
}

void version_verdicts::worker_finished(const version_complete& m) {
  auto& v = versions_[m.version];
  v.busy.upload = std::max(v.busy.upload, m.busy.upload);
  v.busy.broadcast = std::max(v.busy.broadcast, m.busy.broadcast);
  v.busy.apply = std::max(v.busy.apply, m.busy.apply);
  if (!m.digests.empty()) v.workers.push_back(m);
}

bool version_verdicts::shards_in(std::uint64_t version, std::uint32_t shards) const {
  const auto it = versions_.find(version);
  return it != versions_.end() && it->second.shards_done >= shards;
}

bool version_verdicts::digests_match(std::uint64_t version, const plan& p,
                                     const worker_lookup& worker) {
  auto& v = versions_[version];
  bool match = v.trainer_digests.size() == p.segments.size();
  std::vector<std::size_t> per_audience(p.audiences.size(), 0);
  for (const auto& s : p.segments) ++per_audience.at(s.audience);
  for (const auto& report : v.workers) {
    if (const auto who = worker(report.instance, report.rank)) {
      std::size_t heard = 0;
      for (std::uint32_t a = 0; a < per_audience.size(); ++a)
        heard += p.hears(a, *who) ? per_audience[a] : 0;
      if (report.digests.size() != heard) {
        match = false;
        log::error(
            "coordinator: version {}: worker {}.{} reported {} digests for the {} segments it "
            "holds",
            version, report.instance, report.rank, report.digests.size(), heard);
      }
    }
    for (const auto& d : report.digests) {
      auto it = v.trainer_digests.find(d.segment);
      if (it == v.trainer_digests.end() || !(it->second == d)) {
        match = false;
        const auto* s = d.segment < p.segments.size() ? &p.segments[d.segment] : nullptr;
        log::error("coordinator: version {}: tensor '{}' (bytes from {}) differs on worker {}.{}",
                   version, s ? p.tensors[s->tensor].name : "?", s ? s->offset : 0, report.instance,
                   report.rank);
      }
    }
  }
  v.workers.clear();
  if (!match) ++mismatches_;
  return match;
}

version_report version_verdicts::deliver(std::uint64_t version, const plan& p,
                                         std::uint32_t workers, bool verified,
                                         clock::time_point now) {
  const auto& v = versions_[version];
  const version_report report{
      .version = version,
      .bytes = p.total_bytes(),
      .seconds = v.started ? std::chrono::duration<double>(now - *v.started).count() : 0,
      .offloaded_seconds = v.offloaded_seconds,
      .busy = v.busy,
      .workers = workers,
      .verified = verified};
  std::erase_if(versions_, [&](const auto& e) { return e.first < version; });
  return report;
}

}  // namespace ferry
