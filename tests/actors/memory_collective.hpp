#pragma once
/// An instance's collective for members of one process on virtual GPUs, whose memory is host
/// memory: each operation's bytes are copied once every rank has called it, as NCCL moves them
/// between GPUs once every rank has launched it. The host chain cannot serve there: it writes into
/// registered regions, which device slots are not.
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "collectives/broadcast.hpp"
#include "runtime/actor.hpp"
#include "runtime/errc.hpp"
#include "runtime/node.hpp"

namespace ferry::testing {

class memory_collective final : public broadcast_group {
 public:
  struct operation {
    buffer_ref data;
    std::uint32_t stripes = 0;  ///< 0: a broadcast from rank 0
    completion done;
    event_loop* loop = nullptr;
  };
  /// The ranks' operations, by sequence number, until every rank has called one.
  struct shared_state {
    std::map<std::uint64_t, std::vector<std::optional<operation>>> pending;
  };

  memory_collective(std::shared_ptr<shared_state> state, event_loop& loop, std::uint32_t rank,
                    std::uint32_t size)
      : state_(std::move(state)), loop_(loop), rank_(rank), size_(size) {}

  std::uint32_t rank() const override { return rank_; }
  std::uint32_t size() const override { return size_; }
  void async_broadcast(buffer_ref data, completion done) override {
    call({data, 0, std::move(done), &loop_});
  }
  void async_all_gather(buffer_ref data, std::uint32_t stripes, completion done) override {
    call({data, stripes, std::move(done), &loop_});
  }
  void abort() override {
    aborted_ = true;
    for (auto& [seq, ops] : state_->pending) {
      if (auto& mine = ops[rank_]) finish(*std::exchange(mine, std::nullopt), errc::stopped);
    }
  }

 private:
  void call(operation op) {
    if (aborted_) return finish(std::move(op), errc::stopped);
    auto& ops = state_->pending[next_++];
    ops.resize(size_);
    ops[rank_] = std::move(op);
    for (const auto& o : ops)
      if (!o) return;
    copy(ops);
    for (auto& o : ops) finish(std::move(*o), {});
    state_->pending.erase(next_ - 1);
  }
  /// Each stripe from its owner (the root's whole buffer for a broadcast) into every other rank.
  static void copy(const std::vector<std::optional<operation>>& ops) {
    const auto size = ops[0]->data.bytes.size();
    const auto stripes = ops[0]->stripes ? ops[0]->stripes : 1;
    for (std::uint32_t s = 0; s < stripes; ++s) {
      const auto part = ops[0]->stripes ? stripe_of(size, stripes, s) : stripe{0, size};
      for (std::uint32_t r = 0; r < ops.size(); ++r) {
        if (r != s && part.bytes > 0)
          std::memcpy(ops[r]->data.bytes.data() + part.offset,
                      ops[s]->data.bytes.data() + part.offset, part.bytes);
      }
    }
  }
  static void finish(operation op, std::error_code ec) {
    op.loop->post([done = std::move(op.done), ec] { done(ec); });
  }

  std::shared_ptr<shared_state> state_;
  event_loop& loop_;
  std::uint32_t rank_, size_;
  std::uint64_t next_ = 0;
  bool aborted_ = false;
};

/// A factory of memory collectives: the members that name the same ranks in the same epoch share
/// one.
inline broadcast_factory memory_collectives() {
  auto groups = std::make_shared<std::map<std::pair<std::uint32_t, std::vector<address>>,
                                          std::weak_ptr<memory_collective::shared_state>>>();
  return [groups](actor& owner, const std::vector<address>& members, std::uint32_t epoch) {
    auto& slot = (*groups)[{epoch, members}];
    auto state = slot.lock();
    if (!state) slot = state = std::make_shared<memory_collective::shared_state>();
    const auto rank = static_cast<std::uint32_t>(
        std::find(members.begin(), members.end(), owner.self()) - members.begin());
    return std::make_unique<memory_collective>(state, owner.host().loop(), rank,
                                               static_cast<std::uint32_t>(members.size()));
  };
}

}  // namespace ferry::testing
