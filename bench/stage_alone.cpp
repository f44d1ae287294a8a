#include "bench/stage_alone.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "actors/messages.hpp"
#include "actors/plan.hpp"
#include "actors/stages.hpp"
#include "actors/synthetic_model.hpp"
#include "collectives/host/chain_broadcast.hpp"
#include "platform/real_environment.hpp"
#include "protocol/protocol.hpp"
#include "runtime/actor.hpp"
#include "runtime/await.hpp"
#include "runtime/copy_engine.hpp"
#include "runtime/event_loop.hpp"
#include "runtime/host_buffer.hpp"
#include "runtime/node.hpp"
#include "transport/factory.hpp"

namespace ferry::bench {

double stage_seconds::slowest() const {
  return std::max({offload, send, broadcast, apply});
}

const char* stage_seconds::slowest_name() const {
  const double s = slowest();
  if (s == send) return "send";
  if (s == broadcast) return "broadcast";
  if (s == apply) return "apply";
  return "offload";
}

double stage_seconds::sum() const {
  return offload + send + broadcast + apply;
}

namespace {

/// Imm tags on the bench's nodes: the send stage's slot writes, link warm-up, the chain.
constexpr std::uint8_t send_tag = 1;
constexpr std::uint8_t warmup_tag = 3;
constexpr std::uint8_t chain_tag = 2;
constexpr actor_id member_actor = 1;

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// One owner's tensors (a shard's or a worker's) back to back in `into`, as the stages see them.
std::vector<tensor_ref> place(const std::vector<tensor_spec>& owned, host_buffer& into) {
  std::vector<std::uint64_t> at;
  std::uint64_t total = 0;
  for (const auto& t : owned) {
    at.push_back(total);
    total += (t.nbytes + tensor_alignment - 1) / tensor_alignment * tensor_alignment;
  }
  into = host_buffer(total);
  std::vector<tensor_ref> refs;
  for (std::size_t i = 0; i < owned.size(); ++i)
    refs.push_back({.spec = owned[i], .data = into.data() + at[i]});
  return refs;
}

/// One measurement session: nodes, memory and chains for one shape, on the calling thread.
class session {
 public:
  explicit session(const stage_shape& shape) : shape_(shape), env_(loop_) {}

  ~session() {
    // Stopped mid-stage, messages and writes may still be on their way to a chain: the members
    // drop what is queued, their nodes close and forget the chain's writes, and the copies on the
    // pool land, all before a chain or a buffer goes away.
    for (auto& m : members_) m->stop();
    for (auto& n : nodes_) {
      n->forget_writes(chain_tag);
      n->close();
    }
    env_.wait_idle();
    chains_.clear();
    members_.clear();
  }

  bool prepare(std::string& why);
  stage_seconds measure_once(std::string& why);
  /// Ends the measurement: each stage issues nothing more and lets what is in flight land; the
  /// chains abort (their members could no longer agree on the next chunk). Owning loop only.
  void stop() {
    stopping_ = true;
    for (auto& c : chains_) c->abort();
  }
  event_loop& loop() { return loop_; }

 private:
  node& trainer_node(std::uint32_t s) { return *nodes_[s]; }
  node& worker_node(std::uint32_t instance, std::uint32_t rank) {
    return *nodes_[shape_.trainers + instance * shape_.workers_per_instance + rank];
  }
  std::uint32_t worker_count() const { return shape_.instances * shape_.workers_per_instance; }
  bool warm_up(std::string& why);
  /// Runs the loop until `pending` drops to 0 or an error is recorded; false on error. Once
  /// stopped, it waits for everything in flight (`pending` counts what was never issued out).
  bool drain(const std::size_t& pending, std::string& why);

  double offload();
  double send();
  double broadcast();
  double apply();

  stage_shape shape_;
  event_loop loop_;
  real_environment env_;
  transport_settings environment_;
  std::shared_ptr<const plan> plan_;
  std::vector<std::unique_ptr<node>> nodes_;

  std::vector<host_buffer> trainer_tensors_;  ///< per shard, tensors laid out back to back
  std::vector<std::vector<tensor_ref>> trainer_refs_;
  std::vector<tensor_placement> trainer_placements_;  ///< per shard
  std::vector<host_buffer> host_copies_;              ///< per shard, its packed stream
  std::vector<region_desc> host_regions_;
  std::vector<host_buffer> leader_slots_;  ///< per instance: `trainers * depth` receive slots
  std::vector<region_desc> leader_regions_;
  std::vector<host_buffer> worker_slots_;  ///< per worker: `depth` broadcast / apply slots
  std::vector<region_desc> worker_regions_;
  std::vector<host_buffer> worker_tensors_;  ///< per worker, every tensor back to back
  std::vector<std::vector<tensor_ref>> worker_refs_;
  std::vector<tensor_placement> worker_placements_;  ///< per worker
  std::vector<host_buffer> warmup_;
  std::vector<region_desc> warmup_regions_;

  // The actors' own stages: per shard, and per worker.
  std::vector<std::unique_ptr<offload_stage>> offload_stages_;
  std::vector<std::unique_ptr<send_stage>> send_stages_;
  std::vector<std::unique_ptr<apply_stage>> apply_stages_;
  std::vector<std::unique_ptr<actor>> members_;  ///< instance 0's chain members
  std::vector<std::unique_ptr<chain_broadcast>> chains_;
  std::uint32_t chain_epoch_ = 1;
  std::optional<std::string> error_;
  bool stopping_ = false;
};

bool session::prepare(std::string& why) {
  const auto model = synthetic_transformer(shape_.model_bytes);
  const auto shards = split_over_shards(model, shape_.trainers);
  plan_inputs in{.chunk_bytes = shape_.chunk_bytes, .depth = shape_.depth, .shard_tensors = shards};
  for (std::uint32_t s = 0; s < shape_.trainers; ++s) in.shards.push_back({s, member_actor});
  for (std::uint32_t i = 0; i < shape_.instances; ++i) {
    instance_plan inst{.id = i};
    for (std::uint32_t r = 0; r < shape_.workers_per_instance; ++r) {
      inst.workers.push_back({shape_.trainers + i * shape_.workers_per_instance + r, member_actor});
    }
    in.instances.push_back(std::move(inst));
  }
  auto p = make_plan(in, why);
  if (!p) return false;
  plan_ = std::make_shared<const plan>(std::move(*p));

  std::random_device random;
  for (int i = 0; i < 32; ++i) environment_.secret.push_back(static_cast<std::byte>(random()));
  const std::uint32_t node_count = shape_.trainers + worker_count();
  for (node_id id = 0; id < node_count; ++id) {
    auto t = make_transport(shape_.transport, env_, id, environment_);
    if (!t) {
      why = "cannot create the " + shape_.transport + " transport: " + t.error().message();
      return false;
    }
    nodes_.push_back(std::make_unique<node>(env_, id, *t, protocol()));
    if (auto ec = nodes_.back()->start()) {
      why = "cannot start node " + std::to_string(id) + ": " + ec.message();
      return false;
    }
  }
  for (auto& a : nodes_) {
    for (auto& b : nodes_) {
      if (a != b) (void)a->transport().add_peer(b->id(), b->transport().local_address());
    }
  }

  auto registered = [&](node& n, host_buffer& b, std::vector<region_desc>& into) {
    auto r = n.transport().register_region(b.span());
    if (!r) {
      why = "cannot register memory on node " + std::to_string(n.id()) + ": " + r.error().message();
      return false;
    }
    into.push_back(*r);
    return true;
  };
  const auto slot_bytes = std::size_t{shape_.depth} * shape_.chunk_bytes;
  const plan_index index(plan_);
  for (std::uint32_t s = 0; s < shape_.trainers; ++s) {
    trainer_refs_.push_back(place(shards[s], trainer_tensors_.emplace_back()));
    trainer_placements_.emplace_back(index, trainer_refs_.back());
    host_copies_.emplace_back(plan_->shard_bytes[s]);
    if (!registered(trainer_node(s), host_copies_.back(), host_regions_)) return false;
    offload_stages_.push_back(
        std::make_unique<offload_stage>(env_, trainer_node(s).id(), shape_.checksums));
    send_stages_.push_back(
        std::make_unique<send_stage>(env_, trainer_node(s).id(), trainer_node(s).transport()));
  }
  for (std::uint32_t i = 0; i < shape_.instances; ++i) {
    leader_slots_.emplace_back(shape_.trainers * slot_bytes);
    if (!registered(worker_node(i, 0), leader_slots_.back(), leader_regions_)) return false;
  }
  for (std::uint32_t w = 0; w < worker_count(); ++w) {
    node& n = *nodes_[shape_.trainers + w];
    worker_slots_.emplace_back(slot_bytes);
    if (!registered(n, worker_slots_.back(), worker_regions_)) return false;
    worker_refs_.push_back(place(model, worker_tensors_.emplace_back()));
    worker_placements_.emplace_back(index, worker_refs_.back());
    apply_stages_.push_back(std::make_unique<apply_stage>(env_, n.id()));
  }
  for (auto& n : nodes_) {
    warmup_.emplace_back(tensor_alignment * node_count);
    if (!registered(*n, warmup_.back(), warmup_regions_)) return false;
  }

  // Instance 0's chain, as a rollout instance builds it: one actor per member node.
  std::vector<address> members;
  for (std::uint32_t r = 0; r < shape_.workers_per_instance; ++r)
    members.push_back({worker_node(0, r).id(), member_actor});
  for (std::uint32_t r = 0; r < shape_.workers_per_instance; ++r) {
    members_.push_back(std::make_unique<actor>(worker_node(0, r), member_actor));
    chains_.push_back(
        std::make_unique<chain_broadcast>(*members_.back(), members, chain_epoch_, chain_tag));
    members_.back()->set_epoch(chain_epoch_);
    members_.back()->start();
  }
  return warm_up(why);
}

bool session::drain(const std::size_t& pending, std::string& why) {
  loop_.run_until([&] { return pending == 0 || (error_.has_value() && !stopping_); });
  if (stopping_) {
    why = "stopped";
    return false;
  }
  if (error_) {
    why = *error_;
    return false;
  }
  return true;
}

bool session::warm_up(std::string& why) {
  // Links connect lazily (tcp): one small write between every pair, both ways, before timing.
  std::size_t pending = 0;
  for (auto& a : nodes_) {
    for (auto& b : nodes_) {
      if (a == b) continue;
      ++pending;
      const std::span<const std::byte> bytes(warmup_[a->id()].data() + b->id() * tensor_alignment,
                                             tensor_alignment);
      a->transport().async_write(bytes, warmup_regions_[b->id()], a->id() * tensor_alignment,
                                 make_imm(warmup_tag, 0), [this, &pending](std::error_code ec) {
                                   if (ec) error_ = "warm-up write failed: " + ec.message();
                                   --pending;
                                 });
    }
  }
  return drain(pending, why);
}

double session::offload() {
  // As a trainer shard does: its chunks in order, `depth` copying at once, every shard at once.
  std::size_t pending = shape_.trainers;
  const auto start = clock_type::now();
  for (std::uint32_t s = 0; s < shape_.trainers; ++s) {
    loop_.spawn([this, s, &pending] {
      slot_counter copying(plan_->depth);
      for (auto id : plan_->chunks_of(s)) {
        if (stopping_) break;
        copying.acquire();
        offload_stages_[s]->async_run(
            plan_->chunks[id], trainer_placements_[s], host_copies_[s].span(), 0,
            [] { return true; }, true,
            [this, &copying](const offload_stage::outcome& done) {
              if (done.error) error_ = "offload copy failed: " + done.error.message();
              copying.release();
            });
      }
      for (std::uint32_t i = 0; i < plan_->depth; ++i) copying.acquire();  // every copy ended
      --pending;
    });
  }
  std::string why;
  drain(pending, why);
  return seconds_since(start);
}

double session::send() {
  // As the trainer shards do: one sender per (shard, leader), `depth` writes in flight each.
  std::size_t pending = 0;
  std::vector<std::unique_ptr<slot_counter>> credits;
  std::vector<std::deque<std::uint32_t>> free(std::size_t{shape_.trainers} * shape_.instances);
  const auto start = clock_type::now();
  for (std::uint32_t s = 0; s < shape_.trainers; ++s) {
    for (std::uint32_t i = 0; i < shape_.instances; ++i) {
      const auto route = s * shape_.instances + i;
      credits.push_back(std::make_unique<slot_counter>(shape_.depth));
      for (std::uint32_t k = 0; k < shape_.depth; ++k) free[route].push_back(s * shape_.depth + k);
      const auto chunks = plan_->chunks_of(s);
      pending += chunks.size();
      loop_.spawn(
          [this, s, i, chunks, &pending, credit = credits.back().get(), &slots = free[route]] {
            for (std::size_t k = 0; k < chunks.size(); ++k) {
              credit->acquire();
              if (stopping_) {
                pending -= chunks.size() - k;
                return;
              }
              const auto id = chunks[k];
              const auto slot = slots.front();
              slots.pop_front();
              const auto& c = plan_->chunks[id];
              send_stages_[s]->write({host_copies_[s].data() + c.shard_offset, c.bytes},
                                     leader_regions_[i], std::uint64_t{slot} * shape_.chunk_bytes,
                                     make_imm(send_tag, slot), 0, id,
                                     [this, slot, credit, &slots, &pending](std::error_code ec) {
                                       if (ec) error_ = "send write failed: " + ec.message();
                                       slots.push_back(slot);
                                       credit->release();
                                       --pending;
                                     });
            }
          });
    }
  }
  std::string why;
  drain(pending, why);
  return seconds_since(start);
}

double session::broadcast() {
  // Instance 0's chain: every member calls in chunk order with `depth` calls outstanding; the
  // root sends from its slots as a leader does from its receive slots.
  const auto members = shape_.workers_per_instance;
  std::size_t pending = std::size_t{members} * plan_->chunks.size();
  std::vector<std::unique_ptr<slot_counter>> credits;
  std::vector<std::deque<std::uint32_t>> free(members);
  const auto start = clock_type::now();
  for (std::uint32_t r = 0; r < members; ++r) {
    credits.push_back(std::make_unique<slot_counter>(shape_.depth));
    for (std::uint32_t k = 0; k < shape_.depth; ++k) free[r].push_back(k);
    loop_.spawn([this, r, &pending, credit = credits.back().get(), &slots = free[r]] {
      for (std::size_t k = 0; k < plan_->chunks.size(); ++k) {
        const auto& c = plan_->chunks[k];
        credit->acquire();
        if (stopping_) {
          pending -= plan_->chunks.size() - k;
          return;
        }
        if (error_) return;
        const auto slot = slots.front();
        slots.pop_front();
        const std::uint64_t offset = std::uint64_t{slot} * shape_.chunk_bytes;
        const buffer_ref ref{.bytes = {worker_slots_[r].data() + offset, c.bytes},
                             .region = worker_regions_[r],
                             .offset = offset};
        chains_[r]->async_broadcast(ref,
                                    [this, slot, credit, &slots, &pending](std::error_code ec) {
                                      if (ec) error_ = "broadcast failed: " + ec.message();
                                      slots.push_back(slot);
                                      credit->release();
                                      --pending;
                                    });
      }
    });
  }
  std::string why;
  drain(pending, why);
  return seconds_since(start);
}

double session::apply() {
  // Every worker scatters every chunk from its slots into its tensors, `depth` at once.
  std::size_t pending = std::size_t{worker_count()} * plan_->chunks.size();
  std::vector<std::unique_ptr<slot_counter>> credits;
  std::vector<std::deque<std::uint32_t>> free(worker_count());
  const auto start = clock_type::now();
  for (std::uint32_t w = 0; w < worker_count(); ++w) {
    credits.push_back(std::make_unique<slot_counter>(shape_.depth));
    for (std::uint32_t k = 0; k < shape_.depth; ++k) free[w].push_back(k);
    loop_.spawn([this, w, &pending, credit = credits.back().get(), &slots = free[w]] {
      for (std::size_t k = 0; k < plan_->chunks.size(); ++k) {
        const auto& c = plan_->chunks[k];
        credit->acquire();
        if (stopping_) {
          pending -= plan_->chunks.size() - k;
          return;
        }
        const auto slot = slots.front();
        slots.pop_front();
        const std::span<const std::byte> source(
            worker_slots_[w].data() + std::size_t{slot} * shape_.chunk_bytes, c.bytes);
        apply_stages_[w]->run(c, worker_placements_[w], source, 0,
                              [this, slot, credit, &slots, &pending](std::error_code ec) {
                                if (ec) error_ = "apply copy failed: " + ec.message();
                                slots.push_back(slot);
                                credit->release();
                                --pending;
                              });
      }
    });
  }
  std::string why;
  drain(pending, why);
  return seconds_since(start);
}

stage_seconds session::measure_once(std::string& why) {
  stage_seconds s;
  s.offload = offload();
  if (!error_ && !stopping_) s.send = send();
  if (!error_ && !stopping_) s.broadcast = broadcast();
  if (!error_ && !stopping_) s.apply = apply();
  if (stopping_) {
    why = "stopped";
  } else if (error_) {
    why = *error_;
  }
  return s;
}

}  // namespace

result<stage_seconds> measure_stages(const stage_shape& shape, int repeats, std::string& why,
                                     std::stop_token stop) {
  std::optional<stage_seconds> measured;
  // A thread of its own: its fiber scheduler and loop never meet the caller's (a job's) loop.
  std::thread worker([&] {
    try {
      session s(shape);
      std::stop_callback on_stop(stop, [&s] { s.loop().post([&s] { s.stop(); }); });
      if (!s.prepare(why)) return;
      std::vector<double> offload, send, broadcast, apply;
      for (int i = 0; i < std::max(1, repeats) && !stop.stop_requested(); ++i) {
        const auto once = s.measure_once(why);
        if (!why.empty()) return;
        offload.push_back(once.offload);
        send.push_back(once.send);
        broadcast.push_back(once.broadcast);
        apply.push_back(once.apply);
      }
      if (stop.stop_requested()) {
        why = "stopped";
        return;
      }
      measured = stage_seconds{.offload = median(offload),
                               .send = median(send),
                               .broadcast = median(broadcast),
                               .apply = median(apply)};
    } catch (const std::exception& e) {
      why = std::string("stage measurement failed: ") + e.what();
    }
  });
  worker.join();
  if (!measured) {
    if (why.empty()) why = "stage measurement failed";
    return fail(errc::stopped);
  }
  return *measured;
}

}  // namespace ferry::bench
