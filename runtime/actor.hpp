#pragma once
/// An actor: an address, a mailbox, and typed handlers that run one at a time on its own fiber.
#include <boost/container/flat_map.hpp>
#include <boost/fiber/condition_variable.hpp>
#include <deque>
#include <functional>

#include "runtime/await.hpp"
#include "runtime/codec.hpp"
#include "runtime/log.hpp"
#include "runtime/message.hpp"

namespace ferry {

class node;

/// Owning loop only. Handlers may suspend (await I/O, wait for slots); the mailbox waits
/// meanwhile. Stop, then let the loop run until `finished()`, before destroying an actor.
class actor {
 public:
  actor(node& host, actor_id id);
  virtual ~actor();
  actor(const actor&) = delete;
  actor& operator=(const actor&) = delete;

  address self() const { return self_; }
  node& host() const { return host_; }

  /// How a handler runs. `may_suspend`: on the mailbox fiber, where it may await I/O or wait for
  /// slots. `never_suspends`: a message that finds the mailbox empty and its fiber waiting is
  /// handled at once, on the loop's main fiber where it arrived: the same order, without a fiber
  /// wake and two switches (most of a message's cost in a simulation of hundreds of actors). Such
  /// a handler must not block on fiber primitives; notifying them is fine.
  enum class handling { may_suspend, never_suspends };

  /// Registers the handler for messages of kind `M`; one handler per kind. Before `start()`: the
  /// handlers lie in one array, and a running handler (it may be suspended) must not move. A
  /// handler's exception fails the loop (`event_loop::run` rethrows it); on the mailbox fiber it
  /// also closes the actor.
  template <message M>
  void on(std::function<void(const envelope_header&, const M&)> handler,
          handling how = handling::may_suspend) {
    handlers_[M::kind] = {.run = [handler = std::move(handler)](
                                     const decoded_message& m) { handler(m.head, m.as<M>()); },
                          .at_once = how == handling::never_suspends};
  }

  /// Sends `body` to `to`, stamped with this actor's address, epoch and next sequence number.
  template <message M>
  void send(address to, const M& body);
  /// The same; `sent` runs once the frame left this node (or failed to), on the loop: a sender of
  /// large messages to many peers keeps a few in flight instead of every frame at once.
  template <message M>
  void send(address to, const M& body, std::function<void(std::error_code)> sent);

  /// The same for a body encoded once for many recipients.
  void send(address to, const encoded_body& body, std::function<void(std::error_code)> sent);

  /// Starts the mailbox fiber.
  void start();
  /// Closes the mailbox; queued messages are dropped and the fiber ends.
  void stop();
  bool finished() const { return finished_; }

  /// Puts a protocol event (a stale write dropped, a new epoch waiting for old readers) on the
  /// node's timeline, where tests and the simulation count it.
  void note(std::string what);

  std::uint32_t epoch() const { return epoch_; }
  void set_epoch(std::uint32_t e) { epoch_ = e; }

  /// Called by the node on the loop's main fiber; never blocks.
  void enqueue(decoded_message m);

 private:
  struct registered_handler {
    std::function<void(const decoded_message&)> run;
    bool at_once = false;  ///< `handling::never_suspends`
  };
  /// The mailbox fiber: serves until the mailbox closes or a handler throws, then marks it
  /// finished.
  void serve();
  void serve_mailbox();
  /// Runs a `never_suspends` handler where the message arrived, the mailbox fiber waiting.
  void handle_at_once(const registered_handler& h, const decoded_message& m);
  void send_frame(address to, frame f, std::function<void(std::error_code)> sent = {});
  /// Whether this actor's node hands messages over as objects rather than frames.
  bool hands_over() const;
  void hand_over(address to, handed_message m, std::function<void(std::error_code)> sent);

  node& host_;
  address self_;
  std::uint32_t epoch_ = 0;
  /// Looked up per message: a sorted array, where a tree's nodes each missed the cache at 384
  /// simulated GPUs (bench/results/sim_scale.md).
  boost::container::flat_map<msg_kind, registered_handler> handlers_;
  std::deque<decoded_message> mailbox_;
  loop_confined confined_;
  boost::fibers::condition_variable_any cv_;
  /// The mailbox fiber waits on `cv_`: a message arriving while it is busy needs no notification
  /// (a condition variable's lock and wait list, cold in a simulation of hundreds of actors).
  bool waiting_ = false;
  bool open_ = false;
  bool finished_ = true;
};

template <message M>
void actor::send(address to, const M& body) {
  send(to, body, nullptr);
}

template <message M>
void actor::send(address to, const M& body, std::function<void(std::error_code)> sent) {
  envelope_header head{.from = self_, .to = to, .epoch = epoch_};
  if (hands_over() && passes_own_check(body)) {
    head.kind = M::kind;
    if (const auto size = frame_size(head, body);
        size.bytes - size.shared_bytes < max_handed_over_bytes) {
      return hand_over(
          to, {.message = {head, std::make_shared<const M>(body)}, .frame_bytes = size.bytes},
          std::move(sent));
    }
  }
  send_frame(to, encode(head, body), std::move(sent));
}

}  // namespace ferry
