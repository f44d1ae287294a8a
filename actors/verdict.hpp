#pragma once
/// The coordinator's end-to-end verdict on each version: the trainers' per-segment digests against
/// every worker's (each digests the segments it hears), and what the version cost (time, the
/// trainers' stall, each stage's busy time).
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "actors/messages.hpp"
#include "actors/plan.hpp"
#include "runtime/clock.hpp"

namespace ferry {

/// What one delivered version cost.
struct version_report {
  std::uint64_t version = 0;
  std::uint64_t bytes = 0;       ///< bytes the trainers sent once (each worker received its share)
  double seconds = 0;            ///< first publish_started to the last worker's version_complete
  double offloaded_seconds = 0;  ///< the slowest shard's publish -> offloaded (the trainer's stall)
  stage_times busy;              ///< per stage, the busiest participant
  std::uint32_t workers = 0;
  bool verified = false;  ///< every worker's digests equal the trainers'
};

/// Owning loop only: the coordinator feeds it what members report, and asks for the verdict once
/// every worker holds a version.
class version_verdicts {
 public:
  void publish_started(std::uint64_t version, clock::time_point at);
  void offloaded(const shard_offloaded& m);
  void sent(const shard_sent& m);
  void shard_finished(const shard_done& m);
  void worker_finished(const version_complete& m);

  /// Every shard's digests and busy times of `version` are in.
  bool shards_in(std::uint64_t version, std::uint32_t shards) const;
  /// The address of worker (instance, rank) now, if it is still in the job.
  using worker_lookup =
      std::function<std::optional<address>(std::uint32_t instance, std::uint32_t rank)>;
  /// Whether every digest a worker reported for `version` equals the trainers', and each worker
  /// still in the job reported every segment it hears (logging each that differs). The workers'
  /// digests are consumed: a catch-up reports anew.
  bool digests_match(std::uint64_t version, const plan& p, const worker_lookup& worker);
  /// The report of a delivered `version`; older versions are forgotten (the delivered one's
  /// digests stay, for late joiners).
  version_report deliver(std::uint64_t version, const plan& p, std::uint32_t workers, bool verified,
                         clock::time_point now);
  /// Versions whose digests differed.
  std::uint32_t mismatches() const { return mismatches_; }

 private:
  struct version_state {
    std::optional<clock::time_point> started;
    double offloaded_seconds = 0;
    std::uint32_t shards_done = 0;
    std::map<std::uint32_t, tensor_digest> trainer_digests;
    std::vector<version_complete> workers;  ///< their reports that carried digests
    stage_times busy;
  };
  std::map<std::uint64_t, version_state> versions_;
  std::uint32_t mismatches_ = 0;
};

}  // namespace ferry
