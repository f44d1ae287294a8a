#pragma once
/// The coordinator: membership and epochs, the plan, one update at a time, failure detection,
/// regrouping, and the end-to-end verdict.
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "actors/membership.hpp"
#include "actors/messages.hpp"
#include "actors/update_scheduler.hpp"
#include "actors/verdict.hpp"
#include "runtime/actor.hpp"
#include "runtime/clock.hpp"

namespace ferry {

/// What the job starts with; the first plan waits until all of it has registered. Later, workers
/// and instances may join and leave, and a trainer shard may be replaced.
struct job_shape {
  std::uint32_t trainers = 2;
  /// Workers of instances 0..n-1 the first plan waits for. Any other instance id (below
  /// `job_limits::max_instance_id`) may join at any time: elastic rollout.
  std::vector<std::uint32_t> instance_sizes{3, 3};
  std::uint64_t chunk_bytes = default_chunk_bytes;
  std::uint32_t depth = default_depth;
  /// Leaders per instance (k), each receiving one stripe of every chunk; at most the instance's
  /// size. 0: every member leads when the workers hold their tensors on GPUs (each leader then
  /// uploads through its own PCIe link), one leader otherwise.
  std::uint32_t stripes = 0;
  /// Trainers keep their host copies in shared memory (a memfd) and leaders map them and read
  /// each chunk in place instead of receiving a write: no point-to-point copy. Every trainer and
  /// leader must share one host.
  bool shared_host_copies = false;
  /// How chunks go between a trainer and a worker that both hold their tensors on GPUs: GPU to
  /// GPU on one host where the worker's GPU reads the trainer's (automatic), always where they
  /// share a host (device), or through host memory (host).
  p2p_mode p2p = p2p_mode::automatic;
  /// With workers that register part of the table: every instance's members together must
  /// register every published byte (checked once, when the job starts).
  bool require_coverage = true;
  /// A member silent for this long is declared dead (a lost link declares it at once, so this
  /// only catches hung processes; generous, since a loaded host can stall a loop for seconds).
  std::chrono::milliseconds heartbeat_timeout{10000};
  /// Caps on registrations (tensors, names, chunks, regions); breaking one fails the job.
  job_limits limits;
};

/// Where the jobs ferry wires put the coordinator's node, and the actor id of every member's
/// actor (one per node).
constexpr node_id coordinator_node = 0;
constexpr actor_id job_actor = 1;

/// What set off a regroup: a kind that tools act on, the node it concerns, and the log's words.
struct regroup_cause {
  enum class kind : std::uint8_t {
    job_start,       ///< every member the job declared has registered
    trainer_joined,  ///< a trainer shard rejoined, or a new process replaced it
    worker_joined,   ///< a worker joined (perhaps of a new instance)
    link_lost,       ///< the transport saw the member's link end
    left,            ///< the member left, saying why
    silent,          ///< no heartbeat within the timeout
    reported,        ///< another member could not reach it, and it was silent since
    version_failed,  ///< an update was abandoned mid-way
  };
  kind what = kind::job_start;
  std::optional<node_id> node;  ///< the member joined or lost
  std::string text;
};
/// The kind's name in events ("worker_joined").
std::string_view regroup_cause_name(regroup_cause::kind k);

/// One change of membership, from detection to the new plan in force.
struct regroup_report {
  std::uint32_t epoch = 0;
  double milliseconds = 0;
  /// Every cause since the regroup began (several may meet before a plan is in force).
  std::vector<regroup_cause> causes;
  /// The causes' words, joined by "; ".
  std::string reason() const;
  std::uint32_t leaders_lost_mid_update = 0;  ///< leaders lost while an update was in flight
  std::vector<node_id> leaders;               ///< the nodes leading an instance in the new plan
};

/// The job's coordinator actor (`ferry::coordinator` is the public API's handle on one).
/// Owning loop only.
class job_coordinator final : public actor {
 public:
  job_coordinator(node& host, actor_id id, job_shape shape);
  ~job_coordinator() override;

  std::function<void(const version_report&)> on_delivered;
  /// The job cannot go on (bad registration, corrupted bytes).
  std::function<void(const std::string&)> on_failed;
  /// The first plan is in force.
  std::function<void(const plan&)> on_ready;
  std::function<void(const regroup_report&)> on_regroup;
  /// An update starts sending: its version, whether it is a catch-up, and the leaders' nodes.
  std::function<void(std::uint64_t version, bool catch_up, const std::vector<node_id>& leaders)>
      on_update;
  std::function<void(std::uint64_t version, const std::string&)> on_update_failed;

  /// Tells every participant to stop.
  void stop_job();
  const std::optional<plan>& current_plan() const { return plan_; }
  /// The version the job takes next: newer than every version published or delivered.
  std::uint64_t next_version() const { return updates_.next_version(); }
  std::uint32_t regroups() const { return regroups_; }
  /// No update or catch-up in flight, and the plan is in force.
  bool idle() const { return in_force_ && !updates_.active(); }
  /// Updates (catch-ups included) whose worker digests differed from the trainers'.
  std::uint32_t digest_mismatches() const { return verdicts_.mismatches(); }

 private:
  using worker_key = job_membership::worker_key;
  using worker_entry = job_membership::worker_entry;

  /// Takes `M` with `handler` while the coordinator runs; any message says its sender is alive.
  template <message M>
  void handle(void (job_coordinator::*handler)(const envelope_header&, const M&));
  // What members send, one handler a message.
  void on_register_trainer(const envelope_header& h, const register_trainer& m);
  void on_register_worker(const envelope_header& h, const register_worker& m);
  void on_worker_ready(const envelope_header& h, const worker_ready& m);
  void on_peer_unreachable(const envelope_header& h, const peer_unreachable& m);
  void on_heartbeat(const envelope_header& h, const heartbeat&);
  void on_shard_update_failed(const envelope_header& h, const update_failed& m);
  void on_leave_job(const envelope_header& h, const leave_job& m);
  void on_publish_started(const envelope_header& h, const publish_started& m);
  void on_shard_offloaded(const envelope_header& h, const shard_offloaded& m);
  void on_shard_sent(const envelope_header& h, const shard_sent& m);
  void on_shard_done(const envelope_header& h, const shard_done& m);
  void on_version_complete(const envelope_header& h, const version_complete& m);
  void on_participant_error(const envelope_header& h, const participant_error& m);
  void add_peer(address who, const std::string& transport_address);
  void watch_heartbeats();
  /// A member another member cannot reach: lost once it has been silent for a quarter of the
  /// heartbeat timeout too (10 heartbeats; a loaded host can delay a live one's for a second),
  /// checked once more if it is not yet (a live one goes on heartbeating and is left alone).
  void suspect(node_id node, const std::string& why, bool checked_again = false);
  /// Gives up the member on `node`, if any, and regroups for it.
  void lost(node_id node, regroup_cause::kind what, const std::string& why);
  /// A shard lost fails the update in flight and every version published but not yet sent.
  void lose_trainer(std::uint32_t shard, regroup_cause::kind what, const std::string& why);
  /// A worker lost takes nothing from a version it held.
  void lose_worker(worker_key worker, regroup_cause::kind what, const std::string& why);
  /// Whether a report on trainer shard `shard` comes from that shard, a member now or given up:
  /// another member's would start a version the shard never published, or count it done, with
  /// digests of its choosing.
  bool from_shard(const envelope_header& h, std::uint32_t shard);
  /// Whether `worker` is a leader of its instance in the current plan.
  bool leads(const address& worker) const;
  std::vector<node_id> leader_nodes() const;
  void regroup(regroup_cause cause);
  /// What the next plan is made of: the trainers' tables, each worker's checked selection and
  /// the instances; nothing when a worker's registration fails the job.
  std::optional<plan_inputs> plan_inputs_now();
  std::vector<instance_plan> instances_now();
  void adopt_plan(plan p);
  /// The plan on its way to every member, a few frames at a time: a Kimi-K2 plan is tens of MB per
  /// member, hundreds of members at once would be gigabytes of frames.
  struct plan_distribution {
    encoded_body message;    ///< encoded once for every member
    std::deque<address> to;  ///< not sent yet
    std::uint32_t in_flight = 0;
    bool cancelled = false;  ///< a newer plan replaced it, or the coordinator is gone
  };
  void send_plan(plan_ready message);
  void send_more_plans(const std::shared_ptr<plan_distribution>& d);
  void plan_in_force();
  void resume();
  void start_update(update_scheduler::update u);
  /// `version` cannot complete: everyone waiting for it hears why.
  /// `relaid`: the chunk layout changed, and this regroup's plan follows.
  void fail_version(std::uint64_t version, const std::string& reason, bool relaid = false);
  /// Fails every pending version some shard went past without publishing.
  void fail_skipped_versions();
  void check_complete();
  /// Every worker holds `version` of the active update, and every shard reported it.
  bool holds_everywhere(std::uint64_t version) const;
  /// The active update is complete under `p`: delivered (or caught up), and the next one starts.
  void complete_active(const plan& p);
  /// Drops the active update (it failed, or its layout changed) and what departed workers held of
  /// it.
  void abandon_active();
  void fail_job(const std::string& reason);
  template <class F>
  void broadcast_all(F make) {
    members_.for_each([&](const address& who) { send(who, make()); });
  }
  /// Where the trainers write for each leader of `inst`; fails the job when one offered no slots.
  std::optional<std::vector<leader_route>> leader_routes(const instance_plan& inst);
  /// Where the trainers write the chunks `worker` alone (of its instance) hears; fails the job
  /// when it offered no slots.
  std::optional<leader_route> direct_route(std::uint32_t instance, const address& worker);

  job_shape shape_;
  job_membership members_;
  std::set<std::uint32_t> instances_seen_;           ///< every instance id a plan has had
  std::map<node_id, std::uint64_t> suspect_checks_;  ///< members to look at again: their timers
  void answer_given_up(node_id node);
  /// `who` registered again after it was given up: it hears of the versions that failed meanwhile
  /// (a trainer waits for the fate of what it published).
  void readmit(const address& who);
  std::optional<plan> plan_;
  std::shared_ptr<plan_distribution> distribution_;
  std::optional<std::uint64_t>
      layout_;  ///< the last plan's (plan_ may be gone while no worker is left)
  /// The job's last worker left holding the active update before every shard had reported: no plan
  /// comes into force until a worker joins, so the shards' reports complete it under the plan it
  /// was held under, if no worker is in the job then (one that joined and left without it takes
  /// nothing from it).
  struct held_by_departed {
    std::uint64_t version = 0;
    plan under;
  };
  std::optional<held_by_departed> left_holding_;
  selection_set selections_;  ///< every selection the job has seen: they fix the layout
  region_budget regions_;  ///< the regions each node offered, against limits.max_regions_per_peer
  bool started_ = false;   ///< the first plan was made
  bool in_force_ = false;  ///< every worker is ready for the current epoch
  bool failed_ = false;
  bool stopping_ = false;
  std::optional<clock::time_point> regroup_since_;
  std::vector<regroup_cause> regroup_causes_;  ///< since the regroup began
  std::uint32_t leaders_lost_mid_update_ = 0;  ///< since the regroup began
  std::uint32_t regroups_ = 0;
  std::uint64_t heartbeat_timer_ = 0;

  update_scheduler updates_;
  version_verdicts verdicts_;
};

}  // namespace ferry
