#pragma once
/// A rollout worker. Leader and follower are roles of this one actor, so a follower can take
/// over when its leader dies. A leader receives its stripe of each chunk point-to-point into its
/// slots (the whole chunk when the instance has one leader); the instance then broadcasts (one
/// leader) or all-gathers (several) it, and every member verifies and applies it. The first
/// leader orders the instance's chunks.
/// Its code is in three rooms: `rollout_worker.cpp` (joining, plans and their staging, the
/// version accounting), `rollout_inbox.cpp` (what arrives: slot writes, chunk_sent, slot
/// requests, the instance's order) and `rollout_delivery.cpp` (from a slot to applied).
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "actors/direct_slot_grants.hpp"
#include "actors/in_place_sources.hpp"
#include "actors/job_member.hpp"
#include "actors/member_memory.hpp"
#include "actors/messages.hpp"
#include "actors/segment_hasher.hpp"
#include "actors/stages.hpp"
#include "actors/trainer_shard.hpp"
#include "actors/worker_plan.hpp"
#include "actors/worker_staging.hpp"
#include "collectives/broadcast.hpp"
#include "runtime/await.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/host_buffer.hpp"

namespace ferry {

struct worker_options {
  bool checksums = true;  ///< verify each chunk's xxh3-64 before applying it
  bool digests = true;    ///< report xxh3-128 per tensor after each version
  /// Where the broadcast slots live. Null: host memory, and a leader broadcasts straight from
  /// its receive slot. A device: every member has `depth` device slots and a leader uploads
  /// each received chunk into one (the UPLOAD stage) before broadcasting it.
  device_memory* memory = nullptr;
  /// Builds the instance's broadcast group for each epoch (the host chain, NCCL, ...); required.
  broadcast_factory make_broadcast;
  std::chrono::milliseconds heartbeat_interval{250};
};

/// Owning loop only.
class rollout_worker final : public job_member {
 public:
  /// `tensors` say where each tensor lands; a null `data` makes the worker keep the bytes itself
  /// (read them in `on_tensor`). No tensors at all: the worker takes the trainers' table from its
  /// first plan and keeps every tensor's bytes itself, in its GPU's memory when `options.memory`
  /// is a GPU's.
  /// Copies, CPU work and the platform go through `host`'s environment.
  rollout_worker(node& host, actor_id id, address coordinator, std::uint32_t instance,
                 std::uint32_t rank, std::vector<tensor_ref> tensors, worker_options options);
  /// The same with a table other workers hold too: a simulation's 128 whole-model workers of
  /// Kimi-K2 (140k tensors, 25 MB each as a table) keep one.
  rollout_worker(node& host, actor_id id, address coordinator, std::uint32_t instance,
                 std::uint32_t rank, std::shared_ptr<const std::vector<tensor_ref>> tensors,
                 worker_options options);
  ~rollout_worker() override;

  /// Registers with the coordinator.
  void join();

  bool is_leader() const { return leader_; }
  std::uint64_t version() const { return complete_version_; }
  const std::vector<tensor_ref>& tensors() const { return *tensors_; }

  /// A tensor of `version` is complete here: its spec and bytes. Set before the worker starts.
  std::function<void(std::uint64_t version, const tensor_spec&, std::span<const std::byte>)>
      on_tensor;
  /// Every tensor of `version` is applied here; called before the coordinator hears so, hence no
  /// later version lands while it runs.
  std::function<void(std::uint64_t version)> on_version;
  /// `version` cannot complete anywhere (a member died mid-update); what arrived of it is dropped.
  std::function<void(std::uint64_t version, const std::string& reason)> on_update_failed;

 private:
  struct received {
    std::uint32_t slot = 0;
    chunk_sent meta;
  };
  /// What a worker registers of its table: its specs and the bytes it holds of each.
  struct registered_table {
    shared_vector<tensor_spec> tensors;
    shared_vector<byte_range> parts;
    /// The registration of `local`, one for every worker of the process that holds `local` while
    /// any of them keeps it: a simulation's 128 whole-model workers send one 140k-tensor table.
    /// Thread-safe.
    static std::shared_ptr<const registered_table> of(
        const std::shared_ptr<const std::vector<tensor_ref>>& local);
  };

  /// The next chunk this member takes part in.
  struct work {
    std::uint64_t version = 0;
    std::uint32_t chunk = 0;
    std::uint64_t checksum = 0;    ///< the whole chunk's
    std::optional<received> mine;  ///< leaders: the slot holding their stripe
    std::shared_ptr<const mapped_source>
        source;                               ///< a device leader's stripe is uploaded from here
    std::shared_ptr<const worker_plan> plan;  ///< the plan `chunk` belongs to
  };
  struct version_progress {
    std::vector<bool> applied;                ///< per plan chunk
    std::uint32_t chunks = 0;                 ///< how many are applied
    std::vector<std::uint64_t> tensor_bytes;  ///< bytes applied per plan tensor (for on_tensor)
  };
  /// The state of one epoch's staging; a new plan starts a new generation and abandons the old
  /// one's pending work (its completions still run, but touch nothing of the new generation).
  struct generation {
    std::unique_ptr<broadcast_group> broadcast;
    std::uint32_t stripes = 1;                 ///< leaders of the instance
    std::optional<std::uint32_t> stripe;       ///< this member's stripe, when it leads
    std::unique_ptr<slot_counter> credits;     ///< broadcasts in flight (depth)
    std::deque<std::uint32_t> free_slots;      ///< broadcast slots not in use
    std::map<std::uint32_t, bool> landed;      ///< leader: slot -> bytes arrived
    std::map<std::uint32_t, chunk_sent> sent;  ///< leader: slot -> its chunk_sent
    std::deque<received> ready;                ///< leader: complete slots, in arrival order
    std::deque<received> direct;  ///< complete slots of chunks its instance does not hear whole
    /// Direct slots (numbered from `direct_slot_`) and the trainers' requests for them.
    direct_slot_grants grants;
    std::deque<chunk_announce> announcements;  ///< all but the first leader: the instance's order
    address orderer;                           ///< the first leader, who announces that order
    /// Another leader's serve fiber while it waits for its stripe of an announced chunk: only that
    /// stripe wakes it then, and announcements only when it is not waiting so (at 384 GPUs four
    /// wakes in ten found nothing to do). `ready` only grows meanwhile: `at` is where the stripe
    /// landed in it.
    struct awaited_stripe {
      std::uint64_t version = 0;
      std::uint32_t chunk = 0;
      std::optional<std::size_t> at;
    };
    std::optional<awaited_stripe> awaited;
  };

  void adopt_plan(const plan_ready& m);
  /// Sizes the staging for the current plan, in an instance of `stripes` leaders (kept across
  /// epochs while it fits); what failed, or nothing.
  std::optional<std::string> prepare_staging(std::uint32_t stripes);
  /// A new generation of staging work over `members`' collective: the fibers that serve it.
  void start_generation(const std::vector<address>& members, std::optional<std::uint32_t> stripe,
                        std::uint32_t stripes);
  void on_slot_landed(write_imm imm);
  /// A leader's stripe is complete: queued for the serve fiber, woken if it may wait for it.
  void stripe_ready(generation& g, received r);
  /// A trainer says a chunk landed in one of this worker's slots: checked against the plan (the
  /// chunk's own trainer, that trainer's slots) before the slot is trusted.
  void on_chunk_sent(const envelope_header& h, const chunk_sent& m);
  /// Fiber: takes the instance's chunks in order, verifies a leader's stripe, hands each on.
  void serve(std::shared_ptr<generation> g);
  /// Fiber: waits for the next chunk (and a leader's stripe of it); nullopt once `g` is over.
  std::optional<work> next_chunk(const std::shared_ptr<generation>& g);
  /// Fiber: verifies and applies the chunks sent to this worker alone (or to some members of its
  /// instance, along a chain), as they arrive.
  void serve_direct(std::shared_ptr<generation> g);
  /// Writes a chunk this worker received into the next worker of its chain (`m.relay`) and tells
  /// it; then `done`.
  void relay(const std::shared_ptr<generation>& g, const chunk_sent& m,
             std::span<const std::byte> bytes, std::function<void()> done);
  /// Whether receive slot `slot` holds a chunk its instance does not hear whole (a direct slot).
  bool is_direct(std::uint32_t slot) const;
  /// How many direct slots a worker grants at once: enough to keep its link busy while it
  /// applies, and no more however many trainers send to it.
  std::uint32_t direct_slots() const { return worker_slots::direct_count(plan_->job->depth); }
  /// A trainer asks for a direct slot for a chunk: checked against the plan, then queued.
  void on_slot_request(const envelope_header& h, const slot_request& m);
  /// Grants free direct slots to the requests waiting.
  void grant_slots(generation& g);
  /// The trainer shard a worker grants a direct slot first: every worker starts at another (its
  /// place among all workers, spread over the shards).
  std::uint32_t first_shard() const;
  /// One chunk from `serve` to applied: what the completions of its upload, collective, check and
  /// apply need, held once for all of them rather than copied into each (a simulated update
  /// delivers hundreds of thousands).
  struct delivery {
    std::shared_ptr<generation> g;
    work w;
    address shard;                       ///< a leader's: the trainer shard its stripe came from
    buffer_ref target;                   ///< where the instance's collective runs
    std::optional<std::uint32_t> dslot;  ///< the device slot it holds
    bool slot_until_applied = false;     ///< a host leader's receive slot is its target
    stage_meter::started began;          ///< of the stage now running
    int pending = 0;                     ///< the only leader: its broadcast and apply, both
    std::uint64_t actual = 0;            ///< the collected bytes' checksum
  };
  /// Uploads a device leader's stripe, then collects the chunk; `stripe`: a leader's stripe, where
  /// it lies (its receive slot, or the trainer's copy read in place).
  void deliver(const std::shared_ptr<generation>& g, const std::shared_ptr<const worker_plan>& plan,
               work w, std::span<const std::byte> stripe);
  /// Broadcast or all-gather of the target in the instance, verify, apply, then `end_delivery`.
  void collect(std::shared_ptr<delivery> d);
  /// A leader's receive slot is free again: its trainer may send the next chunk there.
  void free_receive_slot(const delivery& d);
  /// The chunk's slots are free again and, if applied, it counts.
  void end_delivery(delivery& d, bool applied);
  /// Broadcast slot `slot`: on the device when there is one, else in the receive slots.
  buffer_ref broadcast_slot(std::uint32_t slot, std::uint64_t bytes) const;
  bool on_device() const { return options_.memory && options_.memory->device() >= 0; }
  /// Where this worker's tensors live, and whether its transport reaches that GPU.
  device_place place() const;
  bool current(const std::shared_ptr<generation>& g) const {
    return g == gen_ && !failed_ && !stopped_;
  }
  /// Copies chunk `chunk` of `plan` from `bytes` into this worker's tensors, then `done`.
  void apply(const worker_plan& plan, std::uint64_t version, std::uint32_t chunk,
             std::span<const std::byte> bytes, std::function<void()> done);
  /// Suspends the fiber while the pool hashes `bytes`; true when checks are off or it matches.
  bool checksum_ok(std::span<const std::byte> bytes, std::uint64_t expected);
  /// One of `in_flight_` ended. Only a new epoch waits on them, for none left: the fibers hear of
  /// the last one, not of each (a worker ends hundreds of thousands in a simulated update).
  void ended_in_flight() {
    if (--in_flight_ == 0) changed();
  }
  /// Counts chunk `chunk` of `plan` as applied, unless a plan of another layout replaced it.
  void chunk_applied(const worker_plan& plan, std::uint64_t version, std::uint32_t chunk);
  /// Every chunk of `version` this worker hears is applied: it tells the coordinator, with its
  /// digests unless they are off, after `on_version`.
  void report_complete(std::uint64_t version);
  /// Fiber: the per-tensor digests of device tensors, hashed through host memory.
  void digest_through_host(version_complete& report);
  worker_ready holdings() const;
  /// Where the worker keeps the trainers' table (`takes_trainers_table_`): its GPU or host memory.
  result<std::vector<tensor_ref>> keep_trainers_table(const std::vector<tensor_spec>& table);
  std::string name() const override;
  void halting() override;

  std::uint32_t instance_;
  std::uint32_t rank_;
  std::shared_ptr<const std::vector<tensor_ref>> tensors_;
  bool takes_trainers_table_ = false;  ///< registered no table: holds whatever the trainers publish
  std::shared_ptr<const registered_table>
      registered_;  ///< made at the first join, kept for a rejoin
  std::vector<host_buffer> owned_;
  std::vector<std::byte*> owned_on_device_;  ///< the trainers' table, kept in `options_.memory`
  worker_options options_;

  std::shared_ptr<const worker_plan> plan_;
  bool leader_ = false;
  std::vector<address> others_;  ///< the instance's other members
  /// Receive slots (leader: its receive slots; host follower: broadcast slots; then direct slots)
  /// and a device member's broadcast slots.
  worker_staging staging_;
  std::uint32_t direct_slot_ =
      0;  ///< the first direct slot: chunks its instance does not hear whole
  /// Trainers' copies read in place here; dropped when their trainer's process is gone.
  in_place_sources sources_;
  segment_hasher hasher_;
  std::shared_ptr<generation> gen_;

  std::map<std::uint64_t, version_progress> progress_;
  std::uint64_t complete_version_ = 0;
  stage_meter upload_meter_, broadcast_meter_;
  apply_stage apply_;
  int in_flight_ = 0;  ///< chunks delivering, relays and reports under way
};

}  // namespace ferry
