#pragma once
/// What every member of a job does, trainer shard or rollout worker: registers with the
/// coordinator, heartbeats, leaves, stops or fails when the job says so, and lets its fibers wait
/// for its state to change.
#include <boost/fiber/condition_variable.hpp>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "runtime/actor.hpp"
#include "runtime/await.hpp"

namespace ferry {

/// Owning loop only.
class job_member : public actor {
 public:
  /// Tells the coordinator this member leaves (the job regroups without it), and stops.
  void leave(const std::string& reason);
  bool failed() const { return failed_; }
  bool stopped() const { return stopped_; }
  /// Plans the coordinator sent this member so far: one after a lost link says it is back in.
  std::uint64_t admissions() const { return admissions_; }

  /// The job failed, or this member cannot go on; it stops.
  std::function<void(const std::string&)> on_failed;
  /// The coordinator ended the job (its versions are delivered); this member stopped.
  std::function<void()> on_job_end;

 protected:
  job_member(node& host, actor_id id, address coordinator,
             std::chrono::milliseconds heartbeat_interval);
  /// Stops heart beating; a derived destructor has already ended its fibers.
  ~job_member() override;

  /// Starts the mailbox, registers with `make_registration()`, and heartbeats from then on. Until
  /// the job admits this member (`admitted()`), the registration goes again after 1, 2, 4, 8, 8...
  /// s: a coordinator not yet serving, or a link not yet up, drops it, and nothing else would
  /// tell. It is made anew for each send: a member of a 140k-tensor table keeps no copy of it.
  template <class Make>
  void join_with(Make make_registration) {
    start();
    send_registration_ = [this, make_registration] { send(coordinator_, make_registration()); };
    register_now();
    beat();
  }
  /// Registers the handler of a message only the coordinator sends (a plan, an order, a verdict).
  /// From any other node, authenticated or not, it is dropped: another member must not stop,
  /// fail or replan this one.
  template <message M>
  void on_coordinator(std::function<void(const envelope_header&, const M&)> handler) {
    on<M>([this, handler = std::move(handler)](const envelope_header& h, const M& m) {
      if (h.from != coordinator_) return dropped_not_from_coordinator(h, M::kind);
      handler(h, m);
    });
  }
  /// The coordinator sent this member a plan: its registration arrived.
  void admitted() {
    registering_ = false;
    ++admissions_;
  }
  /// Links this member to a new plan's members: adds those it lacks, and removes those the last
  /// plan had and this one dropped (where the transport tracks writes), so that what a dropped
  /// member still has on its way (a write held up by a cut link) stops: tcp shuts the link
  /// mid-payload, inproc drops what the cut held. A dropped member that comes back is in a later
  /// plan again.
  void link_to(const std::vector<peer_entry>& peers);
  /// Fails this member once: logs, calls `failing()`, then `on_failed`.
  void fail(const std::string& reason);
  /// Fails the job for `reason`, which no regroup mends (corrupted bytes, memory the host does
  /// not have): the coordinator is told, then this member fails.
  void fail_job(const std::string& reason);
  /// "trainer shard 1", "worker 0.2": the member in log lines.
  virtual std::string name() const = 0;
  /// The member's own part of stopping or failing: wake its fibers that wait on credits, so
  /// that they see it and end.
  virtual void halting() {}

  /// Wakes every fiber waiting in `wait_for`.
  void changed() { state_cv_.notify_all(); }
  /// Fiber only: suspends until `pred()` holds or the member stopped or failed; false then.
  template <class Pred>
  bool wait_for(Pred pred) {
    return wait_for(state_cv_, pred);
  }
  /// The same, woken only through `on`: for a wait that most changes leave alone, whose waker
  /// knows it. Whatever `pred` reads must notify `on` when it changes, and so must `halting`.
  template <class Pred>
  bool wait_for(boost::fibers::condition_variable_any& on, Pred pred) {
    std::unique_lock lock(state_confined_);
    on.wait(lock, [&] { return failed_ || stopped_ || pred(); });
    return !failed_ && !stopped_;
  }
  /// Fiber only: suspends until `pred()` holds, stopped or not (work in flight must end).
  template <class Pred>
  void wait_even_if_stopped(Pred pred) {
    std::unique_lock lock(state_confined_);
    state_cv_.wait(lock, pred);
  }
  /// Stops this member's work (the job stopped, it left, it is being destroyed).
  void stop_member();

  address coordinator_;
  bool failed_ = false;
  bool stopped_ = false;
  int fibers_ = 0;  ///< fibers of this member still running; its destructor waits for them

 private:
  void beat();
  /// The coordinator is the job: a member that lost its link to it has nothing left to wait for.
  /// But at the job's end the link may drop just before its job_stop is read, and a cut link may
  /// come back (heartbeats go on over a new link, and a coordinator that gave the member up asks
  /// it to register again): a plan within `coordinator_grace` says it is still in.
  void lost_coordinator(std::error_code why);
  void dropped_not_from_coordinator(const envelope_header& h, msg_kind kind);
  /// Sends the registration, and again every `registration_wait_` until a plan admits it.
  void register_now();
  static constexpr std::chrono::seconds coordinator_grace{5};

  std::chrono::milliseconds heartbeat_interval_;
  std::uint64_t heartbeat_timer_ = 0;
  std::uint64_t peer_watch_ = 0;             ///< our watch of the node's lost peers
  std::uint64_t grace_timer_ = 0;            ///< while the link to the coordinator is down
  std::function<void()> send_registration_;  ///< set by join_with
  bool registering_ = false;                 ///< registered, and not admitted yet
  std::uint64_t admissions_ = 0;
  std::vector<node_id> linked_;  ///< the last plan's members but this one, sorted
  std::chrono::milliseconds registration_wait_{1000}, since_registration_{0};
  loop_confined state_confined_;
  boost::fibers::condition_variable_any state_cv_;
};

}  // namespace ferry
