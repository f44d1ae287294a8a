#pragma once
/// A whole job on virtual time in one thread, with faults injected at exact virtual moments drawn
/// from a seed: leaders killed mid-update, two regroups within one chunk time, a trainer killed
/// mid-update that rejoins, every worker of an instance killed at once, a new instance joining
/// and an instance leaving for good (elastic rollout), a worker dying unannounced (as on fabric:
/// only a peer that writes to it finds out), a late joiner as the job's last event. Real bytes of a
/// small model, checksums and digests on; every live worker's bytes are checked at the end. One
/// seed gives one run, event for event: `trace_digest` says so. In the spirit of FoundationDB's
/// simulation.
#include <cstdint>
#include <map>
#include <string>

#include "actors/rollout_sharding.hpp"

namespace ferry {

struct virtual_chaos_config {
  std::uint64_t seed = 1;
  std::uint32_t versions = 6;
  std::uint32_t trainers = 2;
  std::uint32_t instances = 2;
  std::uint32_t workers_per_instance = 3;
  std::uint64_t model_bytes = 4ull << 20;
  std::uint64_t chunk_bytes = 256ull << 10;
  /// 0: drawn from the seed (1, 2 or 4); likewise stripes (0 draws 1, 2 or the instance size).
  std::uint32_t depth = 0;
  std::uint32_t stripes = 0;
  /// How each instance's workers split the model (a late joiner of rank r takes share r % size).
  rollout_sharding sharding = rollout_sharding::none;
  /// A run whose virtual clock passes this is a hang.
  double virtual_limit_seconds = 600;
  /// Messages handed over as objects, as `ferry sim` sends them, instead of frames.
  bool hand_over_messages = false;
  std::string trace_path;  ///< Chrome trace JSON of the run, when not empty
};

struct virtual_chaos_result {
  bool verified = false;  ///< every version delivered, every live worker's bytes equal the last one
  std::string error;
  std::uint64_t seed = 0;
  std::uint32_t depth = 0, stripes = 0;
  std::uint64_t delivered = 0;  ///< the newest version delivered to every worker
  std::uint32_t kills = 0, leader_kills = 0, leader_kills_mid_update = 0, trainer_kills = 0,
                joins = 0;
  std::uint32_t regroups = 0;
  double regroup_ms_median = 0, regroup_ms_max = 0;  ///< virtual
  /// Fault kinds injected or met, by name: "leader killed mid-update", "two regroups within one
  /// chunk time", "trainer killed mid-update, rejoined", "every worker of an instance killed
  /// mid-update", "a new instance joined mid-update", "an instance left mid-update",
  /// "registrations lost: the coordinator started late", "late joiner as the last event", and the
  /// protocol events the actors noted ("stale write dropped", ...).
  std::map<std::string, std::uint32_t> faults;
  std::uint64_t trace_digest = 0;
  std::uint64_t trace_events = 0;
  double virtual_seconds = 0;
  double wall_seconds = 0;
};

/// Runs one seeded job on the calling thread (which must have no fibers yet).
virtual_chaos_result run_virtual_chaos(const virtual_chaos_config& config);

}  // namespace ferry
