#pragma once
/// Every message type of the protocol, each with one valid example, for the fuzzer (which
/// round-trips whatever decodes as each type) and its seed generator (one valid frame per kind).
#include <utility>

#include "actors/messages.hpp"
#include "actors/synthetic_model.hpp"
#include "collectives/host/chain_broadcast.hpp"
#include "collectives/nccl/nccl_messages.hpp"
#include "runtime/messages.hpp"

namespace ferry::fuzz {

/// A small but complete plan: two shards, one instance of two workers, several chunks.
inline plan sample_plan() {
  const auto model = synthetic_transformer(4u << 20);
  const auto shards = split_over_shards(model, 2);
  plan_inputs in{.epoch = 3, .chunk_bytes = 1u << 20, .depth = 2};
  in.shards = {{1, 1}, {2, 1}};
  in.shard_tensors = shards;
  in.instances = {{.id = 0, .workers = {{3, 1}, {4, 1}}}};
  std::string why;
  auto p = make_plan(in, why);
  return p ? *p : plan{};
}

inline region_desc sample_region() {
  return {.owner = 3, .id = 7, .addr = 4096, .key = 0x1234'5678'9abc'def0ull, .length = 4u << 20};
}

inline std::vector<tensor_spec> sample_tensors() {
  return {make_tensor_spec("embed", dtype::bf16, {256, 64}),
          make_tensor_spec("layers.0.attn.q", dtype::f32, {64, 64}),
          make_tensor_spec("norm", dtype::fp8_e4m3, {64})};
}

inline std::vector<tensor_digest> sample_digests() {
  return {{.segment = 0, .low = 1, .high = 2}, {.segment = 2, .low = ~0ull, .high = 42}};
}

/// Calls `f.template operator()<M>(example)` for every message type, in kind order.
template <class F>
void for_each_message(F&& f) {
  const stage_times busy{
      .offload = 0.5, .send = 1.25, .upload = 0.0, .broadcast = 3.0, .apply = 1e-3};
  f(ping{.nonce = 1, .payload = "hello"});
  f(pong{.nonce = 1, .payload = "hello"});
  f(register_trainer{
      .shard = 1, .transport_address = "127.0.0.1:4000", .tensors = sample_tensors()});
  f(register_worker{
      .instance = 0, .rank = 1, .transport_address = "[::1]:4001", .tensors = sample_tensors()});
  f(plan_ready{.plan = sample_plan(), .peers = {{1, "127.0.0.1:4000"}, {3, "127.0.0.1:4002"}}});
  f(worker_ready{.instance = 0,
                 .rank = 0,
                 .slots = sample_region(),
                 .complete_version = 8,
                 .partial_version = 9,
                 .partial_chunks = {0, 2, 5}});
  f(job_ready{.routes = {{.instance = 0, .leader = {3, 1}, .slots = sample_region()}},
              .next_version = 9});
  f(job_failed{.reason = "worker 0.1: tensor 'norm' differs"});
  f(job_stop{.reason = "done"});
  f(publish_started{.shard = 1, .version = 9});
  f(shard_offloaded{.shard = 1, .version = 9, .seconds = 0.125});
  f(chunk_sent{.version = 9,
               .chunk = 4,
               .slot = 1,
               .checksum = 0xfeedull,
               .source = {.pid = 4242, .fd = 7, .inode = 99, .host = 1, .bytes = 1 << 20},
               .source_offset = 4096,
               .relay = {{.worker = {4, 2}, .slots = sample_region(), .slot = 3}}});
  f(slot_free{.version = 2, .slot = 1});
  f(slot_request{.version = 9, .chunk = 4});
  f(slot_grant{.version = 9, .chunk = 4, .slot = 2});
  f(chunk_announce{.version = 9, .chunk = 4, .checksum = 0xfeedull});
  f(version_complete{
      .instance = 0, .rank = 1, .version = 9, .busy = busy, .digests = sample_digests()});
  f(version_delivered{.version = 9, .verified = true});
  f(participant_error{.reason = "checksum mismatch in chunk 4"});
  f(update_go{.version = 9,
              .routes = {{.route = {.instance = 0, .leader = {3, 1}, .slots = sample_region()},
                          .chunks = {0, 1, 2, 7}}}});
  f(update_failed{.version = 9, .reason = "trainer shard 1 (node 2) lost"});
  f(heartbeat{.sent_ns = 1'700'000'000'000'000'000ull});
  f(leave_job{.reason = "scaling down"});
  f(shard_sent{.shard = 1, .version = 9, .send_seconds = 0.75});
  f(peer_unreachable{.node = 5, .why = "connection lost"});
  f(register_again{.replaced = false});
  f(shard_done{.shard = 1, .version = 9, .busy = busy, .digests = sample_digests()});
  f(chain_ready{.epoch = 3, .seq = 5, .region = sample_region(), .offset = 1u << 20});
  f(nccl_group_id{.epoch = 3, .size = 4, .id = std::vector<std::uint8_t>(128, 0x5a)});
  f(nccl_group_join{.epoch = 3, .rank = 2});
}

/// A header as a real sender would write it.
inline envelope_header sample_header() {
  return {.from = {1, 1}, .to = {0, 1}, .epoch = 3};
}

}  // namespace ferry::fuzz
