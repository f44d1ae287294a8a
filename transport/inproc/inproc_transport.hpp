#pragma once
/// Transport between nodes of one process (embedding, tests, the demo, virtual time): frames (in a
/// simulation, messages as objects) are posted to the peer's loop and bulk writes are memcpy on
/// the environment's executor, checked like remote ones.
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/environment.hpp"
#include "runtime/event_loop.hpp"
#include "runtime/transport.hpp"
#include "transport/region_table.hpp"

namespace ferry {

class inproc_transport;

/// The process-wide directory of inproc nodes. Thread-safe.
class inproc_network {
 public:
  std::shared_ptr<inproc_transport> find(node_id id) const;
  /// Node `id` dies as a process would: its transport closes at once, and every node that knows
  /// it as a peer learns that the link broke; unless `announced` is false (a connection-less
  /// network, as fabric is): then only a node that sends or writes to it learns. For simulated
  /// failures.
  void sever(node_id id, bool announced = true);
  /// Node `id`'s links are cut (a pulled cable, a partition) and its process lives on; as over
  /// tcp, senders on both sides complete at once (the kernel holds the bytes) and the frames and
  /// writes wait. `mend` delivers them in order, except on a link that one side closed meanwhile
  /// (`remove_peer`, a coordinator giving the node up): those are lost, and both ends learn
  /// that link broke. For simulated failures.
  void cut(node_id id);
  void mend(node_id id);
  /// A modelled network for simulations: a bulk write moves no bytes and lands when `model`
  /// calls its completion (on the loop). `source` and `target` say where its bytes are read and
  /// land (host or GPU memory, by address); both null for a frame. Set before any write; unset,
  /// writes are memcpy.
  using bulk_model =
      std::function<void(node_id from, node_id to, std::uint64_t bytes, const std::byte* source,
                         const std::byte* target, std::function<void()> landed)>;
  void model_bulk(bulk_model model) { model_ = std::move(model); }
  /// Frames of at least `bytes` cross the model too: a Kimi-K2 plan is tens of MB, so sending it
  /// to hundreds of members takes time, and each copy is decoded as it lands rather than all at
  /// once. Smaller frames (control messages) arrive at once, but never ahead of a modelled one.
  /// A node takes such frames one at a time: 128 workers' registrations of 140k tensors each land
  /// at the coordinator one after another, each decoded and handled before the next, rather than
  /// all together when the model shares its link among them.
  void model_frames_from(std::uint64_t bytes) { frame_threshold_ = bytes; }
  /// Messages cross as the objects they are, never encoded nor decoded (`handed_message`): for
  /// simulations, where encoding and decoding took a sixth of the instructions and no byte of a
  /// message is what the model measures. Set before any node starts.
  void hand_over_messages() { hand_over_ = true; }
  /// Its transports register GPU memory on virtual time (GPUDirect RDMA, modelled), where a GPU's
  /// memory is host memory or sizes: tests and simulations of it. Set before any node starts.
  void reach_device_memory() { device_memory_ = true; }

 private:
  friend class inproc_transport;
  void attach(node_id id, std::weak_ptr<inproc_transport> t);
  void detach(node_id id);
  /// Node `to` as a frame or write from `from` finds it, under one lock: null when it is gone.
  struct reach_result {
    std::shared_ptr<inproc_transport> peer;
    bool cut = false;         ///< the link between them is cut
    std::uint64_t as_of = 0;  ///< `changes_` when it was found
  };
  reach_result reach(node_id from, node_id to) const;
  /// Keeps `arrive` (run on `to`'s loop) until the cut link from `from` to `to` is mended.
  void hold(node_id from, node_id to, std::function<void(inproc_transport&)> arrive);
  /// `by` closed its side of the link to `peer`.
  void closed(node_id by, node_id peer);
  mutable std::mutex mutex_;
  /// Counts, under the lock, each change that can alter what `reach` finds (a node attached or
  /// detached, a cut or a mend): a sender keeps what it found until this count moves.
  std::atomic<std::uint64_t> changes_ = 0;
  std::unordered_map<node_id, std::weak_ptr<inproc_transport>> nodes_;
  std::set<node_id> cut_;
  struct held {
    node_id from, to;
    std::function<void(inproc_transport&)> arrive;
  };
  std::vector<held> held_;  ///< in the order sent
  std::set<std::pair<node_id, node_id>>
      broken_;  ///< links closed by one side while cut, (low, high)
  /// Sends a modelled frame to `to` across the model once the frames before it to `to` landed.
  void model_frame(node_id from, node_id to, std::uint64_t bytes, std::function<void()> landed);
  void start_next_frame(node_id to);
  bulk_model model_;
  std::uint64_t frame_threshold_ = UINT64_MAX;
  bool hand_over_ = false;
  bool device_memory_ = false;
  std::unordered_map<node_id, std::deque<std::function<void()>>>
      frames_to_;  ///< modelled frames, the first in flight
};

/// Create with `make`; owning loop only, except where the network calls in (thread-safe parts).
class inproc_transport final : public transport,
                               public std::enable_shared_from_this<inproc_transport> {
  /// Only `make` can name it: the constructor is public for `make_shared`.
  class made_by_make {
    made_by_make() = default;
    friend class inproc_transport;
  };

 public:
  /// One allocation with its reference count, which every message to it touches (`weak_ptr::lock`):
  /// the count shares a cache line with the fields its delivery reads.
  static std::shared_ptr<inproc_transport> make(environment& env, inproc_network& network,
                                                node_id self);
  inproc_transport(made_by_make, environment& env, inproc_network& network, node_id self);
  ~inproc_transport() override;

  std::string_view scheme() const override { return "inproc"; }
  std::string local_address() const override;
  std::error_code start(transport_events events) override;
  void close() override;
  std::error_code add_peer(node_id peer, std::string_view address) override;
  void remove_peer(node_id peer) override;
  void async_send(node_id to, frame f, completion done) override;
  bool hands_over_messages() const override { return network_.hand_over_; }
  void async_hand_over(node_id to, handed_message m, completion done) override;
  result<region_desc> register_region(std::span<std::byte> memory) override;
  /// Where the network says so (`reach_device_memory`), on virtual time only: in a process of real
  /// GPUs, writes are memcpy, which cannot reach device memory.
  bool reaches_device_memory() const override;
  result<region_desc> register_device_region(std::span<std::byte> memory, int device,
                                             std::string& why) override;
  void deregister_region(std::uint64_t region_id) override;
  result<region_desc> rekey_region(std::uint64_t region_id) override;
  bool tracks_writes() const override { return true; }
  bool when_writes_end(std::uint64_t region_id, std::function<void()> done) override;
  void async_write(std::span<const std::byte> local, const region_desc& remote,
                   std::uint64_t offset, write_imm imm, completion done) override;

 private:
  friend class inproc_network;
  /// A frame, or a message handed over as its object (`m.body` set) with the size of its frame.
  struct parcel {
    frame f;
    decoded_message m;
    std::uint64_t bytes = 0;
  };
  void send(node_id to, parcel p, completion done);
  /// Run on this transport's loop.
  void deliver(node_id from, const parcel& p);
  void deliver_write(const write_notice& notice);
  void peer_died(node_id peer);
  void lost_on_the_way(node_id peer);
  /// The network's `reach` from here (nothing once closed), answered from `reached_` while the
  /// network has not changed.
  inproc_network::reach_result reach(node_id to);
  /// Delivers `p` to `to`'s loop now (or says it is unreachable), then completes `done`.
  void hand_over(node_id to, parcel p, completion done);
  /// Sends the frames queued for `to` in order, up to the first modelled one, which `landed` sends.
  void send_queued(node_id to);
  void landed(node_id to);
  bool modelled(const parcel& p) const {
    return network_.model_ && p.bytes >= network_.frame_threshold_;
  }

  event_loop& loop_;
  executor& cpu_;
  inproc_network& network_;
  node_id self_;
  bool virtual_time_;        ///< its environment's: "device memory" there is host memory or sizes
  std::set<node_id> peers_;  ///< added and not removed: who learns of this node's death
  /// Peers a frame or write of ours reached, sorted, and beside each what the network found when
  /// it last looked: searched per message instead of taking the network's lock (a 384-GPU
  /// simulation runs 7-10% faster). The ids lie apart from their links, so that a search among a
  /// leader's hundreds of peers crosses few cache lines.
  std::vector<node_id> reached_;
  struct link {
    std::weak_ptr<inproc_transport> peer;
    bool cut = false;
    std::uint64_t as_of = 0;
  };
  std::vector<link> links_;  ///< of `reached_`, index for index
  /// Per peer, frames behind a modelled one still crossing the network (its head), in order.
  std::unordered_map<node_id, std::deque<std::pair<parcel, completion>>> outbox_;
  region_table regions_;
  transport_events events_;
  bool open_ = false;
};

}  // namespace ferry
