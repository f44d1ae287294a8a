#pragma once
/// A node hosts actors and routes envelopes: to local actors directly, to other nodes through
/// its transport. It rejects and counts bad frames and keeps serving.
#include <array>
#include <functional>
#include <map>
#include <memory>

#include "runtime/clock.hpp"
#include "runtime/codec.hpp"
#include "runtime/environment.hpp"
#include "runtime/event_loop.hpp"
#include "runtime/message_registry.hpp"
#include "runtime/transport.hpp"

namespace ferry {

class actor;

/// Counters of what a node received; `rejected` is indexed by `errc`.
struct node_stats {
  std::uint64_t frames_in = 0;  ///< frames, and messages handed over whole
  std::uint64_t delivered = 0;
  std::uint64_t writes_in = 0;
  std::uint64_t bytes_in =
      0;  ///< bytes landed by bulk writes (as far as the transport reports lengths)
  std::array<std::uint64_t, 16> rejected{};
  std::uint64_t rejected_total() const;
  std::uint64_t rejected_for(errc e) const { return rejected[static_cast<int>(e)]; }
};

/// Owning loop only. Its actors reach time, threads and the OS through `env()`.
class node {
 public:
  node(environment& env, node_id id, std::shared_ptr<transport> transport,
       const message_registry& registry, codec_limits limits = {});
  ~node();

  node_id id() const { return id_; }
  environment& env() { return env_; }
  event_loop& loop() { return env_.loop(); }
  class clock& clock() {
    return env_.clock();
  }
  ferry::transport& transport() { return *transport_; }
  const message_registry& registry() const { return registry_; }
  const node_stats& stats() const { return stats_; }

  /// Starts the transport; frames and writes flow from then on.
  std::error_code start();
  /// Stops every actor and the transport.
  void close();

  void attach(actor& a);
  void detach(actor& a);

  /// Routes one encoded frame to `to`: a local actor, or the transport.
  void route(address to, frame f, std::function<void(std::error_code)> sent = {});
  /// Whether messages go as objects (`route` of a `handed_message`): the transport hands them over.
  bool hands_over_messages() const { return hands_over_; }
  /// Routes one message as its object; only where `hands_over_messages()`.
  void route(address to, handed_message m, std::function<void(std::error_code)> sent = {});

  /// Observers of bulk writes that landed here, keyed by the tag in their imm. Owning loop only.
  void on_write(std::uint8_t tag, std::function<void(const write_notice&)> handler);
  void forget_writes(std::uint8_t tag);
  /// Observer of peers the transport dropped.
  void on_peer_lost(std::function<void(node_id, std::error_code)> handler) {
    peer_lost_ = std::move(handler);
  }
  /// Actors that hear of lost peers too (a member tells its coordinator, which may not see the
  /// link: fabric has none). Returns the token `unwatch_peers` takes.
  std::uint64_t watch_peers(std::function<void(node_id, std::error_code)> watcher);
  void unwatch_peers(std::uint64_t token) { peer_watchers_.erase(token); }
  /// This node's part in the job is over (stopped, left): peers that go now are no news, and are
  /// logged only at debug level.
  void expect_departures() { departures_expected_ = true; }

 private:
  void receive(node_id from, std::span<const std::byte> payload);
  /// A message handed over whole: its kind checked, as decoding checks a frame's, then `accept`.
  void receive(node_id from, decoded_message m);
  /// A message decoded, or handed over whole, from `from`: to its actor, if it is what it claims.
  void accept(node_id from, decoded_message m);
  void reject(node_id from, std::error_code why);

  environment& env_;
  node_id id_;
  std::shared_ptr<ferry::transport> transport_;
  const message_registry& registry_;
  codec_limits limits_;
  std::map<actor_id, actor*> actors_;
  std::map<std::uint8_t, std::function<void(const write_notice&)>> write_handlers_;
  std::function<void(node_id, std::error_code)> peer_lost_;
  std::map<std::uint64_t, std::function<void(node_id, std::error_code)>> peer_watchers_;
  std::uint64_t next_watcher_ = 1;
  bool departures_expected_ = false;
  bool hands_over_ = false;
  node_stats stats_;
};

}  // namespace ferry
