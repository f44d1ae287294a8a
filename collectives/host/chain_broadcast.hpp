#pragma once
/// Broadcast on hosts without NCCL: a pipelined chain over the transport's bulk path. Each member
/// tells its predecessor where to write (a `chain_ready`), receives by one-sided write, and
/// forwards to its successor; consecutive chunks overlap along the chain. An all-gather is one
/// chain per stripe, each starting at the stripe's owner and wrapping around the members.
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "collectives/broadcast.hpp"
#include "collectives/host/chain_messages.hpp"
#include "runtime/actor.hpp"

namespace ferry {

/// Owning loop only. Installs a `chain_ready` handler on `owner` and a write observer on its node
/// for `imm_tag`, so one chain per actor, one actor per tag; a newer chain replaces both, and the
/// owner calls `forget_writes(imm_tag)` when it stops.
class chain_broadcast final : public broadcast_group {
 public:
  chain_broadcast(actor& owner, std::vector<address> members, std::uint32_t epoch,
                  std::uint8_t imm_tag);
  ~chain_broadcast() override;

  std::uint32_t rank() const override { return rank_; }
  std::uint32_t size() const override { return static_cast<std::uint32_t>(members_.size()); }
  void async_broadcast(buffer_ref data, completion done) override;
  void async_all_gather(buffer_ref data, std::uint32_t stripes, completion done) override;
  void abort() override;

 private:
  struct call {
    buffer_ref data;
    std::uint32_t root = 0;
    completion done;
    bool received = false;
    bool forwarding = false;
  };
  /// Starts chain call number next_seq_ of `data` from member `root`.
  void start(buffer_ref data, std::uint32_t root, completion done);
  /// This member's place in a chain from `root`: 0 is the root, size() - 1 the end.
  std::uint32_t position(std::uint32_t root) const { return (rank_ + size() - root) % size(); }
  void on_ready(const chain_ready& m);
  void on_landed(std::uint32_t stamp);  ///< stamp: the imm value, epoch_imm_value(epoch, seq)
  void progress(std::uint64_t seq);
  void finish(std::uint64_t seq, std::error_code ec);

  actor& owner_;
  std::vector<address> members_;
  std::uint32_t epoch_;
  std::uint8_t tag_;
  std::uint32_t rank_ = 0;
  std::uint64_t next_seq_ = 0;
  std::map<std::uint64_t, call> calls_;
  std::map<std::uint64_t, chain_ready>
      targets_;                                 ///< successor's slots, possibly ahead of our calls
  std::map<std::uint32_t, bool> landed_early_;  ///< seq's low 16 bits, landed before their call
  bool aborted_ = false;
  std::shared_ptr<int> alive_ =
      std::make_shared<int>();  ///< write completions check it: expired once destroyed
};

/// The host chain as the broadcast of every epoch; its writes carry `imm_tag`.
broadcast_factory host_chain(std::uint8_t imm_tag);

}  // namespace ferry
