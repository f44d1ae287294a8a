#pragma once
/// The coordinator: membership, the plan, update progress and the end-to-end verdict.
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "actors/messages.hpp"
#include "runtime/actor.hpp"

namespace ferry {

/// What the job consists of; the coordinator waits until all of it has registered.
struct job_shape {
  std::uint32_t trainers = 2;
  std::vector<std::uint32_t> instance_sizes{3, 3};
  std::uint64_t chunk_bytes = default_chunk_bytes;
  std::uint32_t depth = 2;
};

/// What one delivered version cost.
struct version_report {
  std::uint64_t version = 0;
  std::uint64_t bytes = 0;          ///< model bytes (each worker received all of them)
  double seconds = 0;               ///< first publish_started to last version_complete
  double offloaded_seconds = 0;     ///< first publish_started to last shard_offloaded
  stage_times busy;                 ///< per stage, the busiest participant
  std::uint32_t workers = 0;
  bool verified = false;            ///< every worker's digests equal the trainers'
};

/// Owning loop only.
class coordinator final : public actor {
 public:
  coordinator(node& host, actor_id id, job_shape shape);

  std::function<void(const version_report&)> on_delivered;
  std::function<void(const std::string&)> on_failed;
  /// Called once every leader is ready (the plan is in force).
  std::function<void(const plan&)> on_ready;

  /// Tells every participant to stop.
  void stop_job();
  const std::optional<plan>& current_plan() const { return plan_; }

 private:
  struct trainer_entry {
    address who;
    std::string transport_address;
    std::vector<tensor_spec> tensors;
  };
  struct worker_entry {
    address who;
    std::string transport_address;
    std::vector<tensor_spec> tensors;
    std::optional<region_desc> slots;
    bool ready = false;
  };
  struct version_state {
    std::chrono::steady_clock::time_point started;
    std::optional<double> offloaded_seconds;
    std::uint32_t shards_offloaded = 0;
    std::map<std::uint32_t, tensor_digest> trainer_digests;
    std::uint32_t complete = 0;
    stage_times busy;
  };

  void add_peer(address who, const std::string& transport_address);
  void try_plan();
  void try_ready();
  void fail_job(const std::string& reason);
  void broadcast_all(auto make);
  std::uint32_t worker_count() const;
  void check_delivered(std::uint64_t version);

  job_shape shape_;
  std::map<std::uint32_t, trainer_entry> trainers_;
  std::map<std::pair<std::uint32_t, std::uint32_t>, worker_entry> workers_;
  std::optional<plan> plan_;
  bool ready_ = false;
  bool failed_ = false;
  std::map<std::uint64_t, version_state> versions_;
  std::map<std::uint64_t, std::vector<std::vector<tensor_digest>>> pending_digests_;
};

}  // namespace ferry
