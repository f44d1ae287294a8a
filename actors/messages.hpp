#pragma once
/// The weight-update protocol: every message the coordinator, trainer shards and rollout
/// workers exchange. Kinds are stable wire ids in 16-127; never reuse one.
#include <cstdint>
#include <string>
#include <vector>

#include "actors/plan.hpp"
#include "actors/tensor.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/host_buffer.hpp"
#include "runtime/message_registry.hpp"
#include "runtime/shared_vector.hpp"
#include "runtime/transport.hpp"

namespace ferry {

/// A duration on the wire: finite, and 0 to 10^9 s. Anything else (a NaN, or 2^64 from an
/// unsigned encoding, which msgpack-c cannot even pack back without undefined behaviour) makes
/// the body malformed.
inline bool wire_seconds(double s) {
  return s >= 0 && s <= 1e9;
}

/// How to reach a node: its transport address.
struct peer_entry {
  node_id node = 0;
  std::string address;
  FERRY_DEFINE_MAP(node, address)
};

/// Seconds each stage kept an actor busy during one version.
struct stage_times {
  double offload = 0, send = 0, upload = 0, broadcast = 0, apply = 0;
  bool valid() const {
    return wire_seconds(offload) && wire_seconds(send) && wire_seconds(upload) &&
           wire_seconds(broadcast) && wire_seconds(apply);
  }
  FERRY_DEFINE_MAP(offload, send, upload, broadcast, apply)
};

/// A segment's content digest (xxh3-128), for end-to-end verification (a segment is a whole
/// tensor unless some worker registered part of it).
struct tensor_digest {
  std::uint32_t segment = 0;  ///< index into plan::segments
  std::uint64_t low = 0, high = 0;
  friend bool operator==(const tensor_digest&, const tensor_digest&) = default;
  FERRY_DEFINE_MAP(segment, low, high)
};

// --- membership and plan -----------------------------------------------------------------

/// Trainer shard -> coordinator: the tensors this shard publishes.
struct register_trainer {
  static constexpr msg_kind kind{16};
  std::uint32_t shard = 0;
  std::string transport_address;
  std::vector<tensor_spec> tensors;
  device_place place;  ///< where the tensors live: the plan reads GPU to GPU where it can
  FERRY_DEFINE_MAP(shard, transport_address, tensors, place)
};

/// Rollout worker -> coordinator: where it sits and the tensors it expects. Workers of a process
/// that hold one table send one shared copy of it (a simulation's hundreds of 140k-tensor tables).
struct register_worker {
  static constexpr msg_kind kind{17};
  std::uint32_t instance = 0;
  std::uint32_t rank = 0;
  std::string transport_address;
  shared_vector<tensor_spec> tensors;
  bool on_device = false;  ///< the tensors live on a GPU (striping pays off there)
  /// The bytes of each tensor it holds (parallel to `tensors`; empty: all of every one). A worker
  /// that registers part of the table receives only that part.
  shared_vector<byte_range> parts;
  device_place place;  ///< where the tensors live: the plan reads GPU to GPU where it can
  FERRY_DEFINE_MAP(instance, rank, transport_address, tensors, on_device, parts, place)
};

/// Coordinator -> everyone: the plan of this epoch and how to reach every node.
struct plan_ready {
  static constexpr msg_kind kind{18};
  ferry::plan plan;
  std::vector<peer_entry> peers;
  FERRY_DEFINE_MAP(plan, peers)
};

/// Worker -> coordinator: staging for the plan's epoch is allocated; leaders, and workers that
/// receive chunks directly, include their receive slots. It also says what the worker holds, so a
/// regroup resends only what is missing.
struct worker_ready {
  static constexpr msg_kind kind{19};
  std::uint32_t instance = 0;
  std::uint32_t rank = 0;
  /// A leader's `shards * depth` receive slots from slot 0, of `slot_bytes` each, and the
  /// `direct_slots` of chunks its instance does not hear whole from `direct_slot`, of chunk_bytes
  /// each (granted to trainers one chunk at a time, slot_grant); empty if neither
  /// (worker_slots::offset_of).
  region_desc slots;
  std::uint32_t direct_slot = 0;
  /// Of each slot below `direct_slot`: chunk_bytes, or less where each holds just the leader's
  /// stripe, at its start (worker_slots::stripe_only).
  std::uint64_t slot_bytes = 0;
  std::uint64_t complete_version = 0;         ///< the newest version fully applied here
  std::uint64_t partial_version = 0;          ///< a newer version partly applied here, or 0
  std::vector<std::uint32_t> partial_chunks;  ///< the chunks of partial_version applied here
  FERRY_DEFINE_MAP(instance, rank, slots, direct_slot, slot_bytes, complete_version,
                   partial_version, partial_chunks)
};

/// Where a trainer shard writes the chunks for one instance leader: stripe `stripe` of `stripes`
/// of each chunk (the whole chunk when `stripes` is 1). A direct route (the chunks a worker's
/// instance does not hear whole) is a route of one stripe whose slots the worker grants chunk by
/// chunk (slot_request, slot_grant).
struct leader_route {
  std::uint32_t instance = 0;
  address leader;
  region_desc slots;
  std::uint32_t stripe = 0;
  std::uint32_t stripes = 1;
  std::uint32_t first_slot = 0;  ///< shard s uses slots first_slot + s * depth ... + depth - 1
  bool direct = false;
  /// The worker's (worker_ready::slot_bytes): a direct route's slots start at first_slot.
  std::uint64_t slot_bytes = 0;
  FERRY_DEFINE_MAP(instance, leader, slots, stripe, stripes, first_slot, direct, slot_bytes)
};

/// Coordinator -> trainers: the plan of this epoch is in force; publishing may go on from
/// `next_version` (a trainer that rejoined learns where the job stands).
struct job_ready {
  static constexpr msg_kind kind{20};
  std::vector<leader_route> routes;
  std::uint64_t next_version = 1;
  FERRY_DEFINE_MAP(routes, next_version)
};

/// Coordinator -> everyone: the job cannot go on; `reason` says why.
struct job_failed {
  static constexpr msg_kind kind{21};
  std::string reason;
  FERRY_DEFINE_MAP(reason)
};

/// Coordinator -> everyone: the job is over; actors stop.
struct job_stop {
  static constexpr msg_kind kind{22};
  std::string reason;
  FERRY_DEFINE_MAP(reason)
};

// --- one update --------------------------------------------------------------------------

/// Trainer -> coordinator: the shard starts publishing `version`.
struct publish_started {
  static constexpr msg_kind kind{23};
  std::uint32_t shard = 0;
  std::uint64_t version = 0;
  FERRY_DEFINE_MAP(shard, version)
};

/// Trainer -> coordinator: every tensor of the shard is in its host copy (it may train on).
struct shard_offloaded {
  static constexpr msg_kind kind{24};
  std::uint32_t shard = 0;
  std::uint64_t version = 0;
  double seconds = 0;  ///< publish to offloaded: the trainer's stall
  bool valid() const { return wire_seconds(seconds); }
  FERRY_DEFINE_MAP(shard, version, seconds)
};

/// The next worker of a chain, and the slot its trainer reserved there (`chunk_sent::relay`).
struct relay_hop {
  address worker;
  region_desc slots;
  std::uint32_t slot = 0;
  std::uint64_t offset = 0;  ///< where `slot` starts in `slots`
  FERRY_DEFINE_MAP(worker, slots, slot, offset)
};

/// Trainer -> leader: chunk `chunk` of `version` (the leader's stripe of it) is in receive slot
/// `slot`, at the stripe's offset (its bytes arrive by bulk write with imm = slot); checksums
/// are xxh3-64, 0 when checks are off.
struct chunk_sent {
  static constexpr msg_kind kind{25};
  std::uint64_t version = 0;
  std::uint32_t chunk = 0;
  std::uint32_t slot = 0;
  std::uint64_t checksum = 0;        ///< of the bytes written: the route's stripe
  std::uint64_t chunk_checksum = 0;  ///< of the whole chunk, for members that verify it
  /// With shared host copies nothing is written: the chunk lies at `source_offset` in the
  /// trainer's host copy `source`, which the leader maps and reads in place (its stripe at the
  /// stripe's offset from there); the slot is then only the credit. `source.pid` 0: written.
  shared_memory_ref source;
  std::uint64_t source_offset = 0;
  /// Device-direct: the chunk lies at `source_offset` in the trainer's device copies, which the
  /// leader maps and copies from GPU to GPU; nothing is written, no checksum travels (the bytes
  /// never reach host memory; the version's digests still check them). `device_source.pid` 0: none.
  shared_device_ref device_source;
  /// Whether the leader reads the chunk in place rather than from a write into its slot.
  bool in_place() const { return source.pid != 0 || device_source.pid != 0; }
  /// A chunk that some, not all, of an instance's members hear travels from the trainer to the
  /// first of them and on along a chain: the receiver writes it into `relay.front()`'s slot and
  /// tells that worker, with the rest of the chain. A relayed chunk_sent comes from the previous
  /// worker of the chain.
  std::vector<relay_hop> relay;
  FERRY_DEFINE_MAP(version, chunk, slot, checksum, chunk_checksum, source, source_offset,
                   device_source, relay)
};

/// Leader -> trainer: receive slot `slot`, which held a chunk of `version`, is free again (the
/// send stage's credit). The next update of the epoch may start before it arrives (its order
/// comes through the coordinator): the version keeps it from adding a slot the new one has.
struct slot_free {
  static constexpr msg_kind kind{26};
  std::uint64_t version = 0;
  std::uint32_t slot = 0;
  FERRY_DEFINE_MAP(version, slot)
};

/// Trainer -> worker, for a chunk its instance does not hear whole: chunk `chunk` of `version` is
/// offloaded and waits for a slot. A worker's direct slots (from `worker_ready::direct_slot`) are
/// few and shared by every trainer; it grants them round the trainers as they free up, so the
/// chunks it is sent land one after another rather than all at once.
struct slot_request {
  static constexpr msg_kind kind{39};
  std::uint64_t version = 0;
  std::uint32_t chunk = 0;
  FERRY_DEFINE_MAP(version, chunk)
};

/// Worker -> trainer: write chunk `chunk` of `version` into direct slot `slot`. The slot is the
/// worker's again once the chunk is applied there (and relayed, in a chain).
struct slot_grant {
  static constexpr msg_kind kind{40};
  std::uint64_t version = 0;
  std::uint32_t chunk = 0;
  std::uint32_t slot = 0;
  FERRY_DEFINE_MAP(version, chunk, slot)
};

/// First leader -> the other members: the instance's next broadcast or all-gather carries this
/// chunk; `checksum` is the whole chunk's.
struct chunk_announce {
  static constexpr msg_kind kind{27};
  std::uint64_t version = 0;
  std::uint32_t chunk = 0;
  std::uint64_t checksum = 0;
  FERRY_DEFINE_MAP(version, chunk, checksum)
};

/// Worker -> coordinator: every chunk of `version` is applied here.
struct version_complete {
  static constexpr msg_kind kind{28};
  std::uint32_t instance = 0;
  std::uint32_t rank = 0;
  std::uint64_t version = 0;
  stage_times busy;
  std::vector<tensor_digest> digests;
  bool valid() const { return busy.valid(); }
  FERRY_DEFINE_MAP(instance, rank, version, busy, digests)
};

/// Coordinator -> trainers: every live worker holds `version`.
struct version_delivered {
  static constexpr msg_kind kind{29};
  std::uint64_t version = 0;
  bool verified = false;  ///< every digest matched (false when verification is off)
  FERRY_DEFINE_MAP(version, verified)
};

/// Any participant -> coordinator: something failed here (a checksum, a write); fails the job.
struct participant_error {
  static constexpr msg_kind kind{30};
  std::string reason;
  FERRY_DEFINE_MAP(reason)
};

/// Which chunks one leader still needs in an update, of those the receiving trainer sources.
struct route_chunks {
  leader_route route;
  std::vector<std::uint32_t>
      chunks;  ///< plan chunk ids (a trainer sends only its own of any given)
  FERRY_DEFINE_MAP(route, chunks)
};

/// Coordinator -> trainers: send these chunks of `version` (all of them for a new version; the
/// missing ones after a regroup or for a late joiner). One update is in flight at a time.
struct update_go {
  static constexpr msg_kind kind{32};
  std::uint64_t version = 0;
  std::vector<route_chunks> routes;
  FERRY_DEFINE_MAP(version, routes)
};

/// Coordinator -> everyone: `version` cannot complete (a trainer shard died, the chunk layout
/// changed); no worker may report it complete. Publishing resumes once the shard rejoins.
/// Trainer -> coordinator: this shard cannot send `version` (offloaded in a layout since changed).
struct update_failed {
  static constexpr msg_kind kind{33};
  std::uint64_t version = 0;
  std::string reason;
  /// The chunk layout changed: a plan of the new layout follows, and a trainer publishes nothing
  /// before it (a version offloaded in the old layout could never be sent).
  bool relaid = false;
  FERRY_DEFINE_MAP(version, reason, relaid)
};

/// Trainer or worker -> coordinator: still alive (any message counts; this one is sent when idle).
struct heartbeat {
  static constexpr msg_kind kind{34};
  std::uint64_t sent_ns = 0;
  FERRY_DEFINE_MAP(sent_ns)
};

/// Trainer or worker -> coordinator: leaving the job on purpose.
struct leave_job {
  static constexpr msg_kind kind{35};
  std::string reason;
  FERRY_DEFINE_MAP(reason)
};

/// Trainer or worker -> coordinator: its link to `node` broke. The coordinator's own link may
/// not show it (a connection-less transport such as fabric), so a member named here that has been
/// silent for a few heartbeats too is declared lost at once, not at the heartbeat timeout.
struct peer_unreachable {
  static constexpr msg_kind kind{37};
  std::uint32_t node = 0;
  std::string why;
  FERRY_DEFINE_MAP(node, why)
};

/// Coordinator -> a member it declared lost that still heartbeats (its link was cut and came
/// back): register again. `replaced`: another process took its place meanwhile; it stops.
struct register_again {
  static constexpr msg_kind kind{38};
  bool replaced = false;
  FERRY_DEFINE_MAP(replaced)
};

/// Trainer -> coordinator: every chunk of `version` the shard had to send was written.
struct shard_sent {
  static constexpr msg_kind kind{36};
  std::uint32_t shard = 0;
  std::uint64_t version = 0;
  double send_seconds = 0;  ///< busy time of the send stage
  bool valid() const { return wire_seconds(send_seconds); }
  FERRY_DEFINE_MAP(shard, version, send_seconds)
};

/// Trainer -> coordinator: the shard's offload and digests for `version` are done.
struct shard_done {
  static constexpr msg_kind kind{31};
  std::uint32_t shard = 0;
  std::uint64_t version = 0;
  stage_times busy;
  std::vector<tensor_digest> digests;  ///< empty unless verification is on
  bool valid() const { return busy.valid(); }
  FERRY_DEFINE_MAP(shard, version, busy, digests)
};

/// Adds every message above to `registry`.
void register_actor_messages(message_registry& registry);

}  // namespace ferry
