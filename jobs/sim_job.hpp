#pragma once
/// `ferry sim`'s job: the real coordinator, trainer shards and rollout workers on virtual time,
/// with bulk writes, copies and CPU work modelled on a cluster's resources (sim/): no bytes move,
/// payloads are sizes, checksums and applies are costs. Thousands of actors in one process.
#include <chrono>
#include <cstdint>
#include <functional>
#include <stop_token>
#include <string>
#include <vector>

#include "actors/member_memory.hpp"
#include "actors/messages.hpp"
#include "actors/rollout_sharding.hpp"
#include "sim/cluster.hpp"

namespace ferry {

/// A membership event at a virtual moment (seconds from the start).
struct sim_event {
  enum class kind { kill_worker, kill_trainer, join_worker } what = kind::kill_worker;
  double at_seconds = 0;
  std::uint32_t instance = 0, rank = 0;  ///< workers
  std::uint32_t shard = 0;               ///< trainers
};

struct sim_config {
  sim::hardware hardware;
  /// Placement: trainer shard s on GPU s; instance i's rank r on the GPUs after the trainers'
  /// nodes, instance by instance.
  std::uint32_t trainers = 8;
  /// The first rollout GPU; 0: the first GPU after the trainers' nodes.
  std::uint32_t first_worker_gpu = 0;
  /// The trainers' tensors in host memory (their offload is a memcpy), not on their GPUs.
  bool trainers_on_host = false;
  std::uint32_t instances = 1;
  std::uint32_t instance_size = 8;
  /// How each instance's workers split the model (each receives and holds only its part).
  rollout_sharding shard_rollout = rollout_sharding::none;
  std::vector<tensor_spec> model;  ///< the tensor table
  std::uint64_t chunk_bytes = default_chunk_bytes;
  std::uint32_t depth = default_depth;
  std::uint32_t stripes = 1;
  /// Leaders read the trainers' host copies in place (job_shape::shared_host_copies): one node.
  bool shared_host_copies = false;
  /// Where trainer and worker GPUs share a node, whether workers read the trainers' device
  /// copies GPU to GPU (job_shape::p2p): automatic where the worker's GPU reads the trainer's
  /// (`hardware.peer_access`).
  p2p_mode p2p = p2p_mode::automatic;
  std::uint32_t versions = 2;
  bool checksums = true;        ///< their CPU cost, modelled
  double checksum_rate = 20e9;  ///< bytes/s of one thread's xxh3
  std::vector<sim_event> events;
  double virtual_limit_seconds = 3600;
  std::string trace_path;
  /// Progress: each version as it is delivered (virtual seconds it took).
  std::function<void(std::uint64_t version, double seconds)> on_version;
  /// Progress of a long run, about every `progress_every` of wall time: the virtual moment reached
  /// and the transfers started so far.
  std::function<void(double virtual_seconds, std::uint64_t transfers)> on_progress;
  std::chrono::milliseconds progress_every{2000};
  /// A stop requested here (from any thread) ends the run where it stands: `interrupted`.
  std::stop_token stop;
};

struct sim_resource_use {
  std::string name;
  double busy_seconds = 0, utilisation = 0, bytes = 0, bound_seconds = 0;
};

struct sim_result {
  bool delivered = false;
  bool interrupted = false;  ///< the config's stop ended it
  std::string error;
  std::vector<double> update_seconds, stall_seconds;  ///< per version
  double predicted_seconds = 0, stall = 0;            ///< the last version's
  double bound_seconds = 0;  ///< the busiest resource's bytes / rate, per version
  std::string bottleneck;
  stage_times stage_busy;  ///< the last version's, per stage, busiest participant
  job_memory memory;       ///< what the members of the first plan hold
  /// Where they hold more than the hardware has (the first such node or GPU); empty when it fits.
  /// The run goes on: a scenario may stand for what no cluster holds, to measure the simulator.
  std::string memory_short;
  std::vector<sim_resource_use> resources;  ///< the busiest first
  std::uint32_t actors = 0, regroups = 0, kills = 0;
  std::uint64_t transfers = 0, trace_events = 0;
  double virtual_seconds = 0, wall_seconds = 0;
  /// From the first version's delivery to the last's: wall seconds and chunk-stage events, the
  /// simulation's pace without its set-up (both 0 with one version).
  double steady_wall_seconds = 0;
  std::uint64_t steady_events = 0;
};

/// Why `config` cannot run, naming the field; empty when it can.
std::string validate(const sim_config& config);
/// Runs the job on the calling thread (which must have no fibers yet).
sim_result run_sim(const sim_config& config);

}  // namespace ferry
