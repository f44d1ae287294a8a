#pragma once
/// A trainer shard: offloads its tensors into its copies (`shard_copies`), and writes the chunks it
/// sources to instance leaders when the coordinator says which (`update_go`), `depth` writes in
/// flight per leader; with k leaders per instance, each gets one stripe of every chunk. A leader
/// that reads in place (shared host copies, or GPU to GPU from the device copies) is told where
/// the chunk lies instead of being written to.
#include <array>
#include <boost/container/flat_map.hpp>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>

#include "actors/copy_writes.hpp"
#include "actors/job_member.hpp"
#include "actors/member_memory.hpp"
#include "actors/messages.hpp"
#include "actors/segment_hasher.hpp"
#include "actors/shard_copies.hpp"
#include "actors/stages.hpp"
#include "runtime/await.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/host_buffer.hpp"

namespace ferry {

/// Imm tags of bulk writes on a worker's node: chunks into leader slots, and the chain broadcast.
inline constexpr std::uint8_t leader_slot_tag = 1;
inline constexpr std::uint8_t chain_tag = 2;

struct trainer_options {
  bool checksums = true;  ///< xxh3-64 per chunk, verified by every receiver
  bool digests = true;    ///< xxh3-128 per tensor, for the coordinator's end-to-end verdict
  /// The device the shard's tensors live on: its copies run there, the host copies are pinned for
  /// it, and its shared memory holds the device copies; null: host.
  device_memory* memory = nullptr;
  std::chrono::milliseconds heartbeat_interval{250};
};

/// Owning loop only.
class trainer_shard final : public job_member {
 public:
  /// Copies and CPU work go through `host`'s environment.
  trainer_shard(node& host, actor_id id, address coordinator, std::uint32_t shard,
                std::vector<tensor_ref> tensors, trainer_options options = {});
  ~trainer_shard() override;

  /// Registers the shard's tensors with the coordinator.
  void join();
  /// Starts publishing `version`, which must be newer than every version published before. The
  /// offload begins once the host copy it reuses is no longer needed (the version it holds
  /// settled).
  result<void> publish(std::uint64_t version, std::string& why);
  /// The same, from bytes the owner writes into the shard's host copy itself instead of the
  /// shard copying its tensors: `on_write_target` says where once the copy may be written, and
  /// each chunk leaves as soon as `chunks_written` says it is whole. Tensors in host memory only.
  result<void> publish_written(std::uint64_t version, std::string& why);
  /// The owner wrote chunks `ids` of `version` whole (each once).
  void chunks_written(std::uint64_t version, std::span<const std::uint32_t> ids);

  /// The plan is in force; `next_version()` is where the job stands.
  bool ready() const { return ready_; }
  std::uint64_t next_version() const { return next_version_; }
  std::uint64_t delivered() const { return delivered_; }

  /// The plan is in force (first time, or again after a regroup).
  std::function<void()> on_ready;
  std::function<void(std::uint64_t version, double seconds)> on_offloaded;
  /// A written publish of `version` may be written: where its bytes go.
  std::function<void(std::uint64_t version, std::shared_ptr<copy_writes>)> on_write_target;
  std::function<void(std::uint64_t version, bool verified)> on_delivered;
  /// An update cannot complete (another shard died); publishing resumes after `on_ready`.
  std::function<void(std::uint64_t version, const std::string&)> on_update_failed;

 private:
  /// The plan and what this shard derives from it. A regroup replaces it and never changes it, so
  /// a fiber or a route that holds one keeps a consistent view.
  struct shard_plan {
    std::shared_ptr<const ferry::plan>
        job;  ///< shared with the process's other members (share_plan)
    std::shared_ptr<const plan_index> index;  ///< of `job`, shared likewise while a member keeps it
    std::shared_ptr<const tensor_placement> placement;  ///< of the plan's tensors in tensors_
    std::vector<std::uint32_t> my_chunks;               ///< this shard's chunk ids, in send order
    std::vector<std::uint32_t> send_position;  ///< per plan chunk: its place in `my_chunks`
    std::map<address, chunk_path> paths;       ///< the workers reached GPU to GPU, and how
  };
  struct route;
  /// A chunk that several members of an instance, not all, hear: the trainer writes it to the
  /// first, which relays it to the next, and so on. Each member's route asks that member for a
  /// slot, in rank order (so two chains never hold a slot each that the other waits for); the
  /// first one's route waits for every slot, then writes with the chain in its `chunk_sent`.
  struct chain {
    std::vector<relay_hop> hops;  ///< the members after the first, in rank order
    std::vector<route*> routes;   ///< to each member, the first's first; all of one generation
    std::size_t granted = 0;      ///< members, from the first, whose slot is granted
  };
  /// One leader's share of an update: its stripe of each chunk (or a worker's own chunks), sent
  /// in order. It has no fiber: `advance` takes it as far as it can whenever what it waits for
  /// changes (a chunk offloaded, a slot freed or granted, its turn in a chain, a stripe hashed, an
  /// older write ended). At 384 GPUs a fiber per route was 32,768 suspended stacks.
  struct route : std::enable_shared_from_this<route> {
    address leader;
    region_desc slots;
    std::uint32_t stripe = 0;
    std::uint32_t stripes = 1;
    std::uint32_t first_slot = 0;  ///< the route's slots at the leader: every shard's `depth`
    std::uint32_t slot_count = 0;
    bool direct = false;  ///< the worker grants a slot per chunk (`grants`) instead of `free`
    std::uint64_t slot_bytes = 0;  ///< of the leader's slots (leader_route); 0: chunk_bytes
    chunk_path path = chunk_path::host_copy;
    std::uint64_t version = 0;     ///< the update's
    std::uint64_t generation = 0;  ///< the send generation it belongs to; a newer one stops it
    std::shared_ptr<const shard_plan> plan;  ///< the one it was made under
    std::vector<std::uint32_t> chunks;  ///< this shard's chunks the leader needs, in send order
    std::size_t next = 0;  ///< `chunks[next]` is the one it sends now; those before are sent
    std::deque<std::uint32_t> free;                 ///< its slots at the leader that no write holds
    std::map<std::uint32_t, std::uint32_t> grants;  ///< direct: chunk -> the slot granted for it
    /// The progress of `chunks[next]`: its slot, its slot asked for, its stripe's checksum.
    std::optional<std::uint32_t> slot;
    bool asked = false;
    bool hashing = false;
    std::optional<std::uint64_t> checksum;
    bool told_older_writes = false;  ///< its wait for them is noted
    std::size_t in_flight = 0;       ///< writes not ended
    bool voided = false;             ///< its version can never be sent: it stopped
    bool finished = false;           ///< every chunk sent and every write ended
    bool retired = false;            ///< its generation ended: its writes count in `older_writes_`
    bool advancing = false, advance_again = false;  ///< `advance` runs; it was called meanwhile
    /// Chunks this route's worker hears in a chain: the chain, and the worker's place in it (0:
    /// first, written by the trainer; n: `hops[n - 1]`, written by the worker before it).
    std::map<std::uint32_t, std::pair<std::shared_ptr<chain>, std::size_t>> chained;
    route(const leader_route& r, std::uint32_t depth, std::uint32_t shards)
        : leader(r.leader),
          slots(r.slots),
          stripe(r.stripe),
          stripes(std::max(r.stripes, 1u)),
          first_slot(r.first_slot),
          slot_count(shards * depth),
          direct(r.direct),
          slot_bytes(r.slot_bytes) {}
    /// Where slot `id` starts in the worker's `slots`.
    std::uint64_t slot_offset(std::uint32_t id, std::uint64_t chunk_bytes) const {
      const auto leaders_slot = slot_bytes ? slot_bytes : chunk_bytes;
      if (!direct) return id * leaders_slot;
      return worker_slots::offset_of(id, first_slot, leaders_slot, chunk_bytes);
    }
    /// Whether the leader's slots hold the stripe alone, at their start.
    bool stripe_only(std::uint64_t chunk_bytes) const {
      return !direct && slot_bytes && worker_slots::stripe_only(slot_bytes, chunk_bytes);
    }
  };
  void adopt_plan(const plan_ready& m);
  void start_sending(const update_go& go);
  /// Links the routes that carry one chunk to several members of an instance into a chain.
  void link_chains(const update_go& go);
  result<void> start_publish(std::uint64_t version, bool written, std::string& why);
  void run_publish(std::uint64_t version, bool written);
  /// Fiber: OFFLOAD of `copy`'s version, its tensors into its device half (`to_device`) or its
  /// host half; false when the publish stops there.
  bool offload(shard_copies::version_copy& copy, const std::shared_ptr<const shard_plan>& plan,
               bool to_device);
  /// Fiber: `copy`'s version written by the owner (a written publish), each chunk hashed once
  /// whole; false when the publish stops there.
  bool await_writes(shard_copies::version_copy& copy,
                    const std::shared_ptr<const shard_plan>& plan);
  /// Chunk `id` of `version` is offloaded into `copy`'s device or host half (`done` says how it
  /// went): the routes waiting for it go on. False when the publish stops here.
  bool chunk_offloaded(shard_copies::version_copy& copy, std::uint64_t version, std::uint32_t id,
                       const offload_stage::outcome& done, bool device);
  /// Fiber: copies what `copy`'s device half holds into its host half; false when it stopped.
  bool fill_host(shard_copies::version_copy& copy, const std::shared_ptr<const shard_plan>& plan);
  /// Fiber: the digests of the segments this shard owns, as `copy` holds them.
  std::optional<std::vector<tensor_digest>> digests_of(const shard_copies::version_copy& copy,
                                                       const shard_plan& plan);
  /// Takes `r` as far as it can go: sends its chunks in order until one waits for something.
  /// Called again from within (a chain's turn), it goes on once the outer call is done.
  void advance(route& r);
  void advance_chunks(route& r);
  /// Writes chunk `id`'s stripe into the leader's `slot`; `sent` goes to the leader once it landed.
  void write_stripe(route& r, std::uint32_t id, std::uint32_t slot,
                    std::span<const std::byte> stripe, std::uint64_t stripe_offset,
                    chunk_sent sent);
  void on_stripe_written(route& r, const chunk_sent& sent, std::error_code ec);
  /// Takes a slot for the chunk at `r.next`: a free one, or (direct) one the worker granted,
  /// asked for in the chain's order; false while there is none yet.
  bool take_slot(route& r, std::uint32_t chunk);
  /// The chunk at `r.next` is sent (or relayed by another worker): the route moves on.
  void next_chunk(route& r);
  /// What `r`'s leader is told of chunk `id` of `copy`, sent from the device copy when `device`:
  /// where it lies when read in place (the device copy, or a shared host copy), its checksums.
  chunk_sent announce(const route& r, const shard_copies::version_copy& copy, std::uint32_t id,
                      bool device) const;
  /// Where this shard's tensors live, and whether its transport reaches that GPU.
  device_place place() const;
  /// Hashes `stripe` on the CPU executor; the route goes on once it has the checksum.
  void hash_stripe(route& r, std::span<const std::byte> stripe);
  /// Counts `r` finished once its last write ended; the last route of an update reports the send
  /// stage's busy time.
  void finish_if_done(route& r);
  bool current(const route& r) const {
    return r.generation == send_generation_ && !r.voided && !stopped_ && !failed_;
  }
  std::string name() const override { return "trainer shard " + std::to_string(shard_); }
  void halting() override;
  /// Advances every route: a new host copy may be what they wait for.
  void advance_routes();
  /// Drops the routes of a generation that ends; their writes still on the wire count in
  /// `older_writes_` until they end.
  void retire_routes();
  void older_write_ended(const address& leader);
  /// `m.version` cannot complete: senders of it stop, and the owner hears why.
  void version_failed(const update_failed& m);
  /// `version` was offloaded under a plan whose chunk layout has since changed: it can never be
  /// sent; the coordinator is told.
  void void_version(std::uint64_t version);

  std::uint32_t shard_;
  std::vector<tensor_ref> tensors_;
  trainer_options options_;

  std::shared_ptr<const shard_plan> plan_;
  shard_copies copies_;
  segment_hasher hasher_;  ///< for the digests of device copies

  bool ready_ = false;
  std::uint64_t next_version_ = 1;
  std::uint64_t last_published_ = 0;
  std::uint64_t delivered_ = 0;
  std::uint64_t settled_ = 0;          ///< newest version delivered or failed
  std::uint64_t send_generation_ = 0;  ///< bumps on every plan and update_go; older senders stop
  /// The written publish waiting for its owner's writes: the version, its chunks not yet hashed.
  struct awaited_writes {
    std::uint64_t version = 0;
    shard_copies::version_copy* copy = nullptr;
    std::shared_ptr<const shard_plan> plan;
    std::size_t left = 0;
    std::size_t hashing = 0;
    bool stopped = false;
  };
  std::optional<awaited_writes> writes_;
  std::vector<std::shared_ptr<route>> routes_;  ///< of the current generation
  std::size_t routes_left_ = 0;                 ///< of `routes_`, not finished
  int works_in_flight_ =
      0;  ///< writes and hashes of routes, any generation; the destructor waits for them
  /// Per leader, the writes of ended generations still on the wire: one could land after a newer
  /// write of the same slot (a cut link's, overtaken by a new connection) and overwrite it, so
  /// nothing more is written to that leader until they end.
  std::map<address, std::size_t> older_writes_;
  /// The same by leader: a leader's slot_free and slot_grant, one per chunk, find theirs at once,
  /// in one block of memory rather than a tree's scattered nodes.
  boost::container::flat_multimap<address, route*> routes_to_;
  offload_stage offload_;
  send_stage send_;
};

}  // namespace ferry
