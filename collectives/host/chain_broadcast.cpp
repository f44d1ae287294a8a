#include "collectives/host/chain_broadcast.hpp"

#include <algorithm>
#include <utility>

#include "runtime/node.hpp"

namespace ferry {

chain_broadcast::chain_broadcast(actor& owner, std::vector<address> members, std::uint32_t epoch,
                                 std::uint8_t imm_tag)
    : owner_(owner), members_(std::move(members)), epoch_(epoch), tag_(imm_tag) {
  rank_ = static_cast<std::uint32_t>(std::find(members_.begin(), members_.end(), owner.self()) -
                                     members_.begin());
  owner_.on<chain_ready>([this](const envelope_header&, const chain_ready& m) { on_ready(m); });
  owner_.host().on_write(tag_, [this](const write_notice& n) { on_landed(imm_value(n.imm)); });
}

// The write observer stays: a chain of the next epoch has replaced it by now, and the owner
// forgets the tag when it stops for good. Forwards still on the wire complete into nothing.
chain_broadcast::~chain_broadcast() {
  abort();
}

void chain_broadcast::async_broadcast(buffer_ref data, completion done) {
  start(data, 0, std::move(done));
}

void chain_broadcast::async_all_gather(buffer_ref data, std::uint32_t stripes, completion done) {
  struct pending {
    std::uint32_t left = 1;  // released after the loop, so that no stripe finishes the whole early
    std::error_code error;
    completion done;
  };
  auto p = std::make_shared<pending>(pending{.done = std::move(done)});
  auto one_ended = [p](std::error_code ec) {
    if (ec && !p->error) p->error = ec;
    if (--p->left == 0) p->done(p->error);
  };
  for (std::uint32_t s = 0; s < std::max(stripes, 1u); ++s) {
    const auto part = stripe_of(data.bytes.size(), std::max(stripes, 1u), s);
    if (part.bytes == 0) continue;  // every member skips the same empty stripes
    ++p->left;
    start({.bytes = data.bytes.subspan(part.offset, part.bytes),
           .region = data.region,
           .offset = data.offset + part.offset,
           .device = data.device},
          s % size(), one_ended);
  }
  one_ended({});
}

void chain_broadcast::start(buffer_ref data, std::uint32_t root, completion done) {
  const auto seq = next_seq_++;
  if (aborted_) {
    owner_.host().loop().post([done = std::move(done)] { done(errc::stopped); });
    return;
  }
  auto& c = calls_[seq];
  c.data = data;
  c.root = root;
  c.done = std::move(done);
  c.received =
      position(root) == 0 || landed_early_.erase(imm_number(static_cast<std::uint32_t>(seq))) > 0;
  if (position(root) > 0) {
    owner_.send(
        members_[(rank_ + size() - 1) % size()],
        chain_ready{.epoch = epoch_, .seq = seq, .region = data.region, .offset = data.offset});
  }
  progress(seq);
}

void chain_broadcast::on_ready(const chain_ready& m) {
  if (aborted_ || m.epoch != epoch_) return;
  targets_[m.seq] = m;
  progress(m.seq);
}

void chain_broadcast::on_landed(std::uint32_t stamp) {
  // A write of an older epoch's chain may land after this chain replaced it: not ours.
  if (!imm_of_epoch(stamp, epoch_)) return owner_.note("stale write dropped");
  // The imm carries the low 16 bits of seq; the oldest unreceived call with those bits is it.
  const auto seq16 = imm_number(stamp);
  for (auto& [seq, c] : calls_) {
    if (imm_number(static_cast<std::uint32_t>(seq)) == seq16 && !c.received) {
      c.received = true;
      progress(seq);
      return;
    }
  }
  landed_early_[seq16] = true;
}

void chain_broadcast::progress(std::uint64_t seq) {
  auto it = calls_.find(seq);
  if (it == calls_.end() || !it->second.received || it->second.forwarding) return;
  call& c = it->second;
  if (position(c.root) + 1 == size()) return finish(seq, {});
  auto target = targets_.find(seq);
  if (target == targets_.end()) return;
  c.forwarding = true;
  const auto t = target->second;
  targets_.erase(target);
  owner_.host().transport().async_write(
      c.data.bytes, t.region, t.offset,
      make_imm(tag_, epoch_imm_value(epoch_, static_cast<std::uint32_t>(seq))),
      [this, seq, alive = std::weak_ptr<int>(alive_)](std::error_code ec) {
        if (!alive.expired()) finish(seq, ec);
      });
}

void chain_broadcast::finish(std::uint64_t seq, std::error_code ec) {
  auto it = calls_.find(seq);
  if (it == calls_.end()) return;
  auto done = std::move(it->second.done);
  calls_.erase(it);
  done(ec);
}

void chain_broadcast::abort() {
  aborted_ = true;
  targets_.clear();
  // A call whose forward is on the wire still reads its buffer: it ends when that write does, so
  // the owner cannot hand the buffer to a new epoch under it.
  std::vector<completion> stopped;
  for (auto it = calls_.begin(); it != calls_.end();) {
    if (it->second.forwarding) {
      owner_.note("old epoch's chain forward still reads its slot");
      ++it;
      continue;
    }
    stopped.push_back(std::move(it->second.done));
    it = calls_.erase(it);
  }
  for (auto& done : stopped) done(errc::stopped);
}

broadcast_factory host_chain(std::uint8_t imm_tag) {
  return [imm_tag](actor& owner, const std::vector<address>& members, std::uint32_t epoch) {
    return std::make_unique<chain_broadcast>(owner, members, epoch, imm_tag);
  };
}

}  // namespace ferry
