#pragma once
/// A whole job in one process: coordinator, trainer shards and rollout workers, each on its own
/// node, publishing a synthetic model version after version. The demo, tests and bench use it.
#include <cstdint>
#include <functional>
#include <stop_token>
#include <string>
#include <vector>

#include "actors/coordinator.hpp"
#include "actors/rollout_sharding.hpp"

namespace ferry {

struct job_config {
  std::uint32_t trainers = 2;
  std::uint32_t instances = 2;
  std::uint32_t workers_per_instance = 3;
  std::uint64_t model_bytes = 1ull << 30;
  std::uint64_t chunk_bytes = default_chunk_bytes;
  std::uint32_t depth = default_depth;
  std::uint32_t stripes = 0;           ///< leaders per instance; 0: job_shape's automatic choice
  bool shared_host_copies = false;     ///< leaders read trainers' host copies in place (job_shape)
  p2p_mode p2p = p2p_mode::automatic;  ///< GPU to GPU where it can (job_shape)
  /// How each instance's workers split the table; none: every worker holds all of it.
  rollout_sharding shard_rollout = rollout_sharding::none;
  std::uint32_t versions = 3;
  std::string transport = "inproc";
  bool checksums = true;
  bool verify = true;      ///< per-tensor digests every version, and a byte compare at the end
  std::string trace_path;  ///< the timeline as Chrome trace JSON, when not empty
};

struct job_result {
  bool ok = false;           ///< every version delivered
  bool verified = false;     ///< ... and every worker's bytes equal the trainers'
  bool interrupted = false;  ///< the caller's stop request ended the job before its last version
  std::string error;
  std::uint32_t workers = 0;
  std::uint64_t model_bytes = 0;  ///< bytes of one version
  std::uint64_t tensors = 0;
  std::uint64_t chunks = 0;
  std::uint32_t stripes = 0;  ///< leaders per instance in the first plan
  /// Per update, the most any worker receives against what it holds (1: exactly its bytes).
  double receive_ratio = 0;
  std::uint64_t worker_bytes = 0;  ///< the most bytes any worker receives per update (the plan's)
  plan::pair_count paths;          ///< of the first plan: trainer-worker pairs by path
  /// Measured: the most bytes written into any worker's node per version (its link's receive side).
  std::uint64_t worker_link_bytes = 0;
  std::vector<version_report> versions;
  double seconds() const;  ///< sum of the versions' update times
  double gbps() const;     ///< model bytes per second of update time, as each worker receives them
};

/// Runs the job on the calling thread (which must have no fibers yet). `progress` gets a line
/// per member made, one when the job is ready, and one per delivered version. A stop requested on
/// `stop` (from any thread) ends the job at once, mid-update if need be: the actors unwind as
/// after a failure and the result says `interrupted`.
job_result run_local_job(const job_config& config,
                         const std::function<void(const std::string&)>& progress = {},
                         std::stop_token stop = {});

}  // namespace ferry
