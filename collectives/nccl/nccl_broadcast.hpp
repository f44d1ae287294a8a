#pragma once
/// The instance broadcast (and the all-gather of striping) over NCCL, between the GPUs of one
/// rollout instance, one rank per process or thread. Rank 0 (the leader) makes the ncclUniqueId
/// and sends it to the others in a message; every member creates its communicator on a blocking
/// thread of the platform (ncclCommInitRank blocks until all ranks joined) while calls queue up;
/// operations run on the group's own stream and complete on the loop through a stream host
/// function. A group serves one epoch: regrouping aborts it and builds a new one.
#include <functional>
#include <memory>
#include <vector>

#include "collectives/broadcast.hpp"
#include "collectives/nccl/nccl_messages.hpp"
#include "runtime/actor.hpp"

namespace ferry {

/// Owning loop only. Installs handlers for `nccl_group_id` / `nccl_group_join` on `owner`: one
/// group per actor at a time. Buffers are device pointers on `device`.
class nccl_broadcast final : public broadcast_group {
 public:
  /// `members` in rank order, `owner.self()` among them; `device` is this member's GPU.
  nccl_broadcast(actor& owner, std::vector<address> members, std::uint32_t epoch, int device);
  ~nccl_broadcast() override;

  std::uint32_t rank() const override { return rank_; }
  std::uint32_t size() const override { return static_cast<std::uint32_t>(members_.size()); }
  /// ncclBroadcast from rank 0, in place. Completion `void(std::error_code)` on the loop once the
  /// bytes are in `data` here; queued until the communicator is up.
  void async_broadcast(buffer_ref data, completion done) override;
  /// One ncclBroadcast per non-empty stripe, rooted at the stripe's owner, in one NCCL group.
  void async_all_gather(buffer_ref data, std::uint32_t stripes, completion done) override;
  /// ncclCommAbort; every pending and later operation fails with `errc::stopped`.
  void abort() override;

  /// The communicator is up (operations go straight to the stream).
  bool ready() const;
  /// Why the communicator could not be made (empty while fine).
  std::error_code error() const;

 private:
  struct state;
  struct op {
    std::byte* data = nullptr;
    std::vector<stripe> stripes;  ///< stripe r is rooted at rank r
    completion done;
  };
  void on_id(const nccl_group_id& m);
  void start_init(std::vector<std::uint8_t> id);
  void on_init_done();
  void submit(op o);
  void issue(op o);
  void fail_all(std::error_code ec);

  actor& owner_;
  std::vector<address> members_;
  std::uint32_t epoch_;
  int device_;
  std::uint32_t rank_ = 0;
  std::vector<std::uint8_t> id_;  ///< rank 0: the group's id, sent to every joiner
  std::shared_ptr<state> state_;
  std::vector<op> queued_;
};

/// What rollout workers take as `worker_options::make_broadcast`: an NCCL group on `device`.
std::function<std::unique_ptr<broadcast_group>(actor&, const std::vector<address>&, std::uint32_t)>
nccl_broadcast_factory(int device);

}  // namespace ferry
