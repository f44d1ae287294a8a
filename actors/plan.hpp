#pragma once
/// The static plan: computed once per (tensor table, membership epoch), reused by every update.
/// It packs each trainer shard's tensors into chunks, names who sources and who receives each
/// chunk, and fixes the send order.
///
/// Selective delivery: a worker may register only part of the table (some tensors, or a byte
/// range of one: its rows). Each tensor is then cut into segments where a worker's range starts
/// or ends; a segment's audience is the workers that registered all of it. Segments are packed by
/// audience, so every chunk has one: an instance whose members all hear it takes it through its
/// leaders and collective as before; a member that alone hears it receives it directly from the
/// trainer, and members that some, not all, of an instance hear receive it along a chain: the
/// trainer writes it to the first, each relays it to the next (`chunk_sent::relay`).
///
/// The layout (segments, chunks, what each packs) depends only on the tensor table and the
/// selections the job has seen, not on who is alive: a worker replaced by one of the same part
/// keeps every chunk id, so a regroup resends only what is missing. Only an audience (who hears a
/// chunk now) changes with membership.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "actors/tensor.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/transport.hpp"

namespace ferry {

/// How a trainer shard's chunks reach a worker when both hold their tensors on GPUs.
enum class p2p_mode : std::uint8_t {
  /// GPU to GPU where both GPUs are on one host and the worker's reads the trainer's (peer
  /// access, or the same GPU); through host memory otherwise.
  automatic,
  /// GPU to GPU wherever both GPUs are on one host; a worker whose GPU cannot read the trainer's
  /// fails the job, naming both.
  device,
  /// Always through the trainer's host copy.
  host,
};

/// "auto", "device", "host".
std::string_view p2p_mode_name(p2p_mode mode);
/// The mode named `name` (as `p2p_mode_name` spells it); nullopt for any other.
std::optional<p2p_mode> parse_p2p_mode(std::string_view name);

/// How a trainer shard's chunks reach one worker.
enum class chunk_path : std::uint8_t {
  host_copy,  ///< from the trainer's host copy: written into the worker's slots, or read in place
  device_direct,  ///< read by the worker from the trainer's device copies, GPU to GPU on one host
  gpudirect,  ///< written from the trainer's device copies into the worker's GPU (GPUDirect RDMA)
};
/// The path under `mode` from a trainer shard placed at `shard` to a worker placed at `worker`:
/// device-direct where both GPUs share a host and the worker's reads the trainer's (under
/// `device`, wherever they share a host), else GPUDirect where both transports reach their GPUs,
/// else the host copy.
chunk_path path_between(p2p_mode mode, const device_place& shard, const device_place& worker);

inline constexpr std::uint64_t tensor_alignment = 256;
/// The job's defaults, for every way a job is made (CLI, API, simulation); the public API's own
/// literals are checked against them where it is built.
inline constexpr std::uint64_t default_chunk_bytes = 64ull << 20;
inline constexpr std::uint32_t default_depth = 2;
/// Why no plan can be made with chunks of `chunk_bytes` (a positive multiple of
/// `tensor_alignment`), or nothing.
std::optional<std::string> chunk_bytes_refusal(std::uint64_t chunk_bytes);
/// Why no plan can be made with `depth` chunks in flight per stage (at least one), or nothing.
std::optional<std::string> depth_refusal(std::uint32_t depth);

/// The part of one tensor that lies in one chunk.
struct tensor_piece {
  std::uint32_t tensor = 0;  ///< index into plan::tensors
  std::uint64_t tensor_offset = 0;
  std::uint64_t chunk_offset = 0;
  std::uint64_t bytes = 0;
  FERRY_DEFINE_ARRAY(tensor, tensor_offset, chunk_offset, bytes)  // one per piece: compact
};

/// A byte range of one tensor that one audience needs: the unit of packing and of digests. A
/// plan where every worker takes the whole table has one segment per tensor.
struct tensor_segment {
  std::uint32_t tensor = 0;  ///< index into plan::tensors
  std::uint64_t offset = 0;  ///< in the tensor
  std::uint64_t bytes = 0;
  std::uint64_t shard_offset = 0;  ///< in its shard's packed stream
  std::uint32_t audience = 0;      ///< index into plan::audiences
  FERRY_DEFINE_ARRAY(tensor, offset, bytes, shard_offset, audience)  // one per segment: compact
};

/// A slice of one shard's packed stream; the unit of pipelining. Its segments share one audience.
struct chunk_info {
  std::uint32_t id = 0;  ///< position in plan::chunks, which is the send order
  std::uint32_t shard = 0;
  std::uint64_t shard_offset = 0;  ///< where the chunk starts in the shard's host copy
  std::uint64_t bytes = 0;
  std::vector<tensor_piece> pieces;
  std::uint32_t audience = 0;  ///< index into plan::audiences
  FERRY_DEFINE_MAP(id, shard, shard_offset, bytes, pieces, audience)
};

/// What one worker registered of a published tensor.
struct tensor_range {
  std::string name;
  byte_range range;
  friend auto operator<=>(const tensor_range&, const tensor_range&) = default;
};
/// A worker's part of the table: what it registered, when that is less than all of it.
using selection = std::vector<tensor_range>;
/// One selection, read by every worker that holds it and by every plan made since: an EP16
/// worker's holds ~10,000 ranges, and a copy per worker per regroup was 1.3 M strings at 384 GPUs.
using shared_selection = std::shared_ptr<const selection>;
/// Selections ordered by their contents, each once.
struct by_contents {
  bool operator()(const shared_selection& a, const shared_selection& b) const { return *a < *b; }
};
using selection_set = std::set<shared_selection, by_contents>;
/// `s` as an entry of `set`: the equal one already there, or `s`, added.
inline shared_selection intern(selection_set& set, selection s) {
  return *set.insert(std::make_shared<const selection>(std::move(s))).first;
}

/// One rollout instance: its workers in rank order and the ranks that receive point-to-point.
/// With k leaders every chunk travels as k stripes (`stripe_of`), stripe s to leaders[s], and
/// the instance all-gathers them; leaders[0] orders the instance's chunks.
struct instance_plan {
  std::uint32_t id = 0;
  std::vector<address> workers;
  std::vector<std::uint32_t> leaders;  ///< ranks into `workers`, stripe order; k = leaders.size()
  std::vector<device_place> places;    ///< where each worker's tensors live (empty: host memory)
  FERRY_DEFINE_MAP(id, workers, leaders, places)
};

struct plan {
  std::uint32_t epoch = 0;
  std::uint64_t layout = 0;  ///< a digest of the chunk layout: equal layouts, equal chunk ids
  std::uint64_t digest = 0;  ///< of the whole plan: the layout, the epoch, the members
  std::uint64_t chunk_bytes = default_chunk_bytes;
  std::uint32_t depth = default_depth;
  std::vector<tensor_spec> tensors;        ///< every tensor of the model
  std::vector<std::uint32_t> owner;        ///< the shard that owns tensors[i]
  std::vector<std::uint64_t> shard_bytes;  ///< size of each shard's packed stream (its host copy)
  std::vector<address> shards;             ///< trainer shard actors by rank
  std::vector<chunk_info> chunks;          ///< in send order: shards interleaved
  std::vector<tensor_segment> segments;    ///< in stream order per shard, shards in rank order
  /// Who hears each audience: workers, sorted. Audience 0 is every worker (and its list empty).
  std::vector<std::vector<address>> audiences{{}};
  std::vector<instance_plan> instances;
  /// Trainers keep their host copies in shared memory and leaders read chunks there in place.
  bool shared_host_copies = false;
  p2p_mode p2p = p2p_mode::automatic;
  std::vector<device_place> shard_places;  ///< where each shard's tensors live (empty: host memory)
  FERRY_DEFINE_MAP(epoch, layout, digest, chunk_bytes, depth, tensors, owner, shard_bytes, shards,
                   chunks, segments, audiences, instances, shared_host_copies, p2p, shard_places)

  /// Bytes the trainers send once: every chunk's.
  std::uint64_t total_bytes() const;
  /// Whether `worker` is in `audience`.
  bool hears(std::uint32_t audience, const address& worker) const;
  /// The ranks (indices into `inst.workers`) in `audience`.
  std::vector<std::uint32_t> hearers(const instance_plan& inst, std::uint32_t audience) const;
  /// Whether every member of `inst` hears `audience`: its chunks then travel through the
  /// instance's leaders and collective; otherwise directly to the members that hear it (a chain).
  bool whole_instance(const instance_plan& inst, std::uint32_t audience) const;
  /// The bytes `worker` receives per update: its chunks'.
  std::uint64_t bytes_for(const address& worker) const;
  /// Over every worker: the most bytes one receives per update, and the largest ratio of what one
  /// receives to what it holds (its segments; 1 when nothing is padding or another's).
  struct receive_share {
    std::uint64_t most_bytes = 0;
    double worst_ratio = 0;
  };
  receive_share receive_shares() const;
  /// Ids of the chunks `shard` sources, in send order: each audience's spread evenly over it.
  std::vector<std::uint32_t> chunks_of(std::uint32_t shard) const;
  /// The path of `shard`'s chunks to worker `rank` of `inst`.
  chunk_path path(std::uint32_t shard, const instance_plan& inst, std::size_t rank) const;
  /// What copies `shard` keeps: device copies for the workers reached GPU to GPU (registered with
  /// the transport for GPUDirect), a host copy for the others.
  struct shard_copies {
    bool host = false;
    bool device = false;
    bool device_written = false;  ///< the transport writes from the device copies (GPUDirect)
  };
  shard_copies copies_of(std::uint32_t shard) const;
  /// The (trainer shard, worker) pairs by path.
  struct pair_count {
    std::uint32_t device_direct = 0;
    std::uint32_t gpudirect = 0;
    std::uint32_t all = 0;
  };
  pair_count paths() const;
};

/// One copy of `p` for the whole process: every member adopting a plan of the same digest shares
/// it (a simulation runs hundreds of members, each handed a Kimi-K2 plan of ~35 MB). Thread-safe.
std::shared_ptr<const plan> share_plan(const plan& p);

/// Caps on what a job's registrations may announce. The coordinator holds one; every refusal
/// names the limit and the value that broke it. Defaults are far above real models (Llama-3-405B
/// has ~1.1k tensors; 1 TB in 64 MiB chunks is 16k chunks) and keep a registration's cost bounded.
struct job_limits {
  std::uint32_t max_tensors = 1u << 20;        ///< tensors in one registration and in the plan
  std::uint32_t max_tensor_name_bytes = 1024;  ///< bytes of one tensor name
  std::uint32_t max_chunks = 1u << 22;         ///< chunks in one plan
  std::uint32_t max_regions_per_peer = 64;     ///< distinct regions one node may offer in an epoch
  std::uint32_t max_instance_id = 1u << 16;    ///< rollout instance ids are below this
};

/// Checks one registration's tensor table against `limits` (count and name lengths).
result<void> check_registration(std::span<const tensor_spec> tensors, const job_limits& limits,
                                std::string& why);

/// The regions each peer offered in its latest epoch, capped by `job_limits::max_regions_per_peer`
/// (a worker offers its staging again for every plan, so earlier epochs do not count).
class region_budget {
 public:
  /// Records `region` offered by `peer` in `epoch`; refuses, saying why, one region too many.
  result<void> offer(node_id peer, std::uint32_t epoch, const region_desc& region,
                     const job_limits& limits, std::string& why);
  /// Drops what `peer` offered: it left the job.
  void forget(node_id peer) { offered_.erase(peer); }

 private:
  struct offers {
    std::uint32_t epoch = 0;
    std::set<std::uint64_t> ids;
  };
  std::map<node_id, offers> offered_;
};

struct plan_inputs {
  std::uint32_t epoch = 1;
  std::uint64_t chunk_bytes = default_chunk_bytes;
  std::uint32_t depth = default_depth;
  std::vector<address> shards;
  std::vector<std::vector<tensor_spec>> shard_tensors;  ///< per shard, in registration order
  std::vector<instance_plan> instances;                 ///< leaders may be empty: rank 0 is chosen
  /// Every selection the job has seen (checked by `check_worker_tensors`), whether or not a live
  /// worker holds it now: they fix the layout.
  selection_set selections;
  /// The live workers that registered part of the table, each with its entry of `selections`;
  /// the others take all of it.
  std::map<address, shared_selection> selected;
  /// Every instance's members together must register every published byte.
  bool require_coverage = false;
  job_limits limits;
  bool shared_host_copies = false;
  p2p_mode p2p = p2p_mode::automatic;
  std::vector<device_place> shard_places;  ///< parallel to `shards`; instances carry their workers'

  /// `who` registered `s`: it is selected, and among `selections` unless an equal one is there.
  void select(const address& who, selection s) { selected[who] = intern(selections, std::move(s)); }
};

/// Builds the plan, or says why it cannot: chunk size not a positive multiple of the alignment,
/// a bad tensor table, a tensor owned by two shards, an empty instance, a limit of `in.limits`,
/// bytes no member of an instance registered (with `require_coverage`).
result<plan> make_plan(const plan_inputs& in, std::string& why);

/// The leaders of an instance whose live members are `workers` (rank order), in stripe order, as
/// indices into `workers`. k = `stripes`, or (0) every member when all hold their tensors on
/// devices (each leader then uploads through its own PCIe link) and one otherwise; at most the
/// instance's size. `first_leader` (the previous plan's) keeps its role while it lives: it orders
/// the instance's chunks. Otherwise the lowest live rank takes over; the other leaders are the
/// lowest ranks besides it.
std::vector<std::uint32_t> choose_leaders(const std::vector<address>& workers,
                                          std::uint32_t stripes, bool on_devices,
                                          std::optional<address> first_leader);

/// Tensors found by name, hashed once: what the trainers publish, for every distinct worker table
/// checked against it (a simulation's 16 shares of 140k tensors each), and a plan's (`plan_index`).
class published_tensors {
 public:
  /// Views into `all`, which must outlive it.
  explicit published_tensors(std::span<const tensor_spec> all);
  const tensor_spec* find(std::string_view name) const;
  std::size_t size() const { return size_; }

 private:
  std::unordered_map<std::string_view, const tensor_spec*> by_name_;
  std::size_t size_ = 0;
};

/// What members look up in a plan: a tensor by name, an audience's segments. Made once per plan
/// and shared by the process's members (`of`): each of a 384-GPU simulation's members scanned the
/// plan's 140k tensors, and each worker its segments, to find the few it holds.
class plan_index {
 public:
  explicit plan_index(std::shared_ptr<const plan> job);
  /// The index of `job`, one for every caller that passes the same plan while any keeps it.
  /// Thread-safe.
  static std::shared_ptr<const plan_index> of(const std::shared_ptr<const plan>& job);

  const plan& job() const { return *job_; }
  /// The plan tensor named `name`; -1 when none is.
  std::int64_t tensor_named(std::string_view name) const;
  /// What makes the plan unreadable to a member, or empty: a segment or chunk naming an audience
  /// the plan lacks, a chunk whose id is not its place. Such a segment is in no audience's list.
  const std::string& flaw() const { return flaw_; }
  /// The segments of `audience`, in plan order.
  std::span<const std::uint32_t> segments_of(std::uint32_t audience) const {
    return {segments_.data() + first_segment_[audience],
            segments_.data() + first_segment_[audience + 1]};
  }

 private:
  std::shared_ptr<const plan> job_;  ///< kept: the names below view into it
  published_tensors by_name_;
  std::vector<std::uint32_t> segments_;  ///< grouped by audience
  std::vector<std::uint32_t>
      first_segment_;  ///< per audience, its first in `segments_`; one more at the end
  std::string flaw_;
};

/// Checks a worker's registration against what the trainers publish: names they publish, same
/// dtypes and shapes, each range inside its tensor (`parts`: parallel to `worker`, or empty for
/// whole tensors). Its selection, when it registered less than the whole table, goes to `selected`
/// (sorted by name).
result<void> check_worker_tensors(const published_tensors& published,
                                  std::span<const tensor_spec> worker,
                                  std::span<const byte_range> parts, selection& selected,
                                  std::string& why);

}  // namespace ferry

MSGPACK_ADD_ENUM(ferry::p2p_mode);
