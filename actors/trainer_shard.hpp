#pragma once
/// A trainer shard: offloads its tensors into its host copy and writes the chunks it sources to
/// every instance leader, as the plan says, with `depth` writes in flight per leader.
#include <boost/fiber/condition_variable.hpp>
#include <boost/fiber/mutex.hpp>
#include <deque>
#include <functional>
#include <optional>

#include "actors/messages.hpp"
#include "actors/stage_meter.hpp"
#include "runtime/actor.hpp"
#include "runtime/await.hpp"
#include "runtime/copy_engine.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/host_buffer.hpp"

namespace ferry {

/// Imm tags of bulk writes on a worker's node: chunks into leader slots, and the chain broadcast.
inline constexpr std::uint8_t leader_slot_tag = 1;
inline constexpr std::uint8_t chain_tag = 2;

struct trainer_options {
  bool checksums = true;  ///< xxh3-64 per chunk, verified by every receiver
  bool digests = true;    ///< xxh3-128 per tensor, for the coordinator's end-to-end verdict
  /// The device the shard's tensors live on, whose copies the host copy is pinned for; null: host.
  device_memory* memory = nullptr;
};

/// Owning loop only.
class trainer_shard final : public actor {
 public:
  trainer_shard(node& host, actor_id id, address coordinator, std::uint32_t shard, std::vector<tensor_ref> tensors,
                copy_engine& copies, trainer_options options = {});
  ~trainer_shard() override;

  /// Registers the shard's tensors with the coordinator.
  void join();
  /// Starts publishing `version`; it must be newer than every version published before.
  /// Offloading waits until the previous version is delivered (the host copy is reused).
  result<void> publish(std::uint64_t version, std::string& why);

  bool ready() const { return !routes_.empty(); }
  bool failed() const { return failed_; }
  std::uint64_t delivered() const { return delivered_; }

  std::function<void()> on_ready;
  std::function<void(std::uint64_t version, double seconds)> on_offloaded;
  std::function<void(std::uint64_t version, bool verified)> on_delivered;
  std::function<void(const std::string&)> on_failed;

 private:
  struct route {
    address leader;
    region_desc slots;
    std::unique_ptr<slot_counter> credits;
    std::deque<std::uint32_t> free;
  };

  void adopt_plan(const plan_ready& m);
  void run_publish(std::uint64_t version);
  void send_chunks(route& r, std::uint64_t version, const std::vector<std::uint32_t>& chunks);
  void fail(const std::string& reason);
  void changed() { state_cv_.notify_all(); }
  template <class Pred>
  bool wait_for(Pred pred);

  address coordinator_;
  std::uint32_t shard_;
  std::vector<tensor_ref> tensors_;
  copy_engine& copies_;
  trainer_options options_;

  std::optional<ferry::plan> plan_;
  std::vector<int> local_of_;                       ///< plan tensor index -> tensors_ index, or -1
  std::vector<std::uint64_t> stream_offset_;        ///< plan tensor index -> offset in the host copy
  host_buffer host_copy_;
  std::optional<region_desc> host_region_;
  std::vector<route> routes_;

  std::uint64_t last_published_ = 0;
  std::uint64_t delivered_ = 0;
  std::size_t offloaded_chunks_ = 0;
  std::size_t writes_done_ = 0;
  std::vector<std::uint64_t> checksums_;  ///< per plan chunk
  stage_meter offload_meter_, send_meter_;
  bool failed_ = false;
  bool stopped_ = false;
  int running_ = 0;  ///< publish fibers alive
  boost::fibers::mutex state_mutex_;
  boost::fibers::condition_variable state_cv_;
};

}  // namespace ferry
