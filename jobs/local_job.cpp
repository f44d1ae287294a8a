#include "jobs/local_job.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>

#include "actors/rollout_worker.hpp"
#include "actors/synthetic_model.hpp"
#include "actors/trainer_shard.hpp"
#include "collectives/host/chain_broadcast.hpp"
#include "platform/real_environment.hpp"
#include "protocol/protocol.hpp"
#include "runtime/host_buffer.hpp"
#include "runtime/node.hpp"
#include "transport/factory.hpp"

namespace ferry {

double job_result::seconds() const {
  double s = 0;
  for (const auto& v : versions) s += v.seconds;
  return s;
}

double job_result::gbps() const {
  const double s = seconds();
  return s > 0 ? static_cast<double>(model_bytes) * versions.size() / s / 1e9 : 0;
}

namespace {

/// A trainer's tensors, with storage.
struct trainer_memory {
  std::vector<host_buffer> storage;
  std::vector<tensor_ref> refs;
};

trainer_memory allocate(const std::vector<tensor_spec>& specs) {
  trainer_memory m;
  for (const auto& s : specs) {
    m.storage.emplace_back(s.nbytes);
    m.refs.push_back({.spec = s, .data = m.storage.back().data()});
  }
  return m;
}

/// One in-process job: its loop, environment, nodes and actors, declared in the order they are
/// made (they unwind in reverse).
class local_job {
 public:
  local_job(const job_config& config, const std::function<void(const std::string&)>& progress,
            std::stop_token stop)
      : config_(config),
        progress_(progress),
        stop_(stop),
        // A stop request comes from another thread: it wakes the loop, whose waits all end on it.
        on_stop_(stop, [this] { loop_.post([this] { stopping_ = true; }); }) {}

  job_result run() {
    if (!config_.trace_path.empty()) env_.trace().keep_records();
    // One process, one job: a fresh random secret authenticates the tcp links between its nodes.
    std::random_device random;
    for (int i = 0; i < 32; ++i) settings_.secret.push_back(static_cast<std::byte>(random()));
    for (const auto& t : model_) result_.model_bytes += t.nbytes;
    result_.tensors = model_.size();
    result_.workers = config_.instances * config_.workers_per_instance;
    if (!start()) return std::move(result_);
    loop_.run_until([&] { return ready_ || failure_ || stopping_; });
    publish_versions();
    for (const auto* n : worker_nodes_) {
      result_.worker_link_bytes = std::max<std::uint64_t>(
          result_.worker_link_bytes,
          n->stats().bytes_in / std::max<std::size_t>(result_.versions.size(), 1));
    }
    if (failure_) {
      result_.error = *failure_;
    } else if (stopping_ && result_.versions.size() < config_.versions) {
      result_.interrupted = true;
      result_.error =
          fmt::format("stopped after {} of {} versions", result_.versions.size(), config_.versions);
    } else {
      result_.ok = true;
      result_.verified = config_.verify;
      for (const auto& r : result_.versions) result_.verified = result_.verified && r.verified;
      compare_bytes();
    }
    finish();
    return std::move(result_);
  }

 private:
  /// A node of the job, which reaches the coordinator (node 0) first: the plan tells it the
  /// others. Null once the result says why it cannot be.
  node* add_node() {
    const auto id = static_cast<node_id>(nodes_.size());
    auto t = make_transport(config_.transport, env_, id, settings_);
    if (!t) {
      result_.error =
          "cannot create the " + config_.transport + " transport: " + t.error().message();
      return nullptr;
    }
    nodes_.push_back(std::make_unique<node>(env_, id, *t, protocol()));
    if (auto ec = nodes_.back()->start()) {
      result_.error = "cannot start node " + std::to_string(id) + ": " + ec.message();
      return nullptr;
    }
    if (id != 0)
      nodes_.back()->transport().add_peer(coordinator_node,
                                          nodes_.front()->transport().local_address());
    return nodes_.back().get();
  }

  /// The coordinator, then every member, joined; false once the result says why not.
  bool start() {
    began_ = env_.clock().now();
    node* coordinator_host = add_node();
    if (!coordinator_host) return false;
    coord_ = std::make_unique<job_coordinator>(
        *coordinator_host, job_actor,
        job_shape{.trainers = config_.trainers,
                  .instance_sizes =
                      std::vector<std::uint32_t>(config_.instances, config_.workers_per_instance),
                  .chunk_bytes = config_.chunk_bytes,
                  .depth = config_.depth,
                  .stripes = config_.stripes,
                  .shared_host_copies = config_.shared_host_copies,
                  .p2p = config_.p2p,
                  // One process: no member can die on its own, and pre-faulting staging on the
                  // shared loop must not look like a hang.
                  .heartbeat_timeout = std::chrono::hours(24)});
    watch_coordinator();
    coord_->start();

    const trainer_options trainer_opts{.checksums = config_.checksums, .digests = config_.verify};
    const worker_options worker_opts{.checksums = config_.checksums,
                                     .digests = config_.verify,
                                     .make_broadcast = host_chain(chain_tag)};
    // Members allocate (and fault in) their memory as they are made, a second or so each for
    // large models: a stop between two of them need not wait for the rest.
    const auto shards = split_over_shards(model_, config_.trainers);
    for (std::uint32_t s = 0; s < config_.trainers && !stop_.stop_requested(); ++s) {
      node* n = add_node();
      if (!n) return false;
      memory_.push_back(allocate(shards[s]));
      trainers_.push_back(std::make_unique<trainer_shard>(*n, job_actor, coord_->self(), s,
                                                          memory_.back().refs, trainer_opts));
      built(fmt::format("trainer shard {}", s), memory_.back().refs);
    }
    for (std::uint32_t i = 0; i < config_.instances && !stop_.stop_requested(); ++i) {
      for (std::uint32_t r = 0; r < config_.workers_per_instance && !stop_.stop_requested(); ++r) {
        node* n = add_node();
        if (!n) return false;
        worker_nodes_.push_back(n);
        workers_.push_back(std::make_unique<rollout_worker>(
            *n, job_actor, coord_->self(), i, r,
            rollout_share(model_, config_.shard_rollout, r, config_.workers_per_instance),
            worker_opts));
        built(fmt::format("worker {}.{}", i, r), workers_.back()->tensors());
      }
    }
    for (auto& t : trainers_) t->join();
    for (auto& w : workers_) w->join();
    return true;
  }

  /// A progress line per member made: with large models, faulting in their memory is most of the
  /// set-up (seconds per GB on a VM's memory never touched since boot).
  void built(const std::string& member, const std::vector<tensor_ref>& tensors) {
    if (!progress_) return;
    const auto members = config_.trainers + config_.instances * config_.workers_per_instance;
    progress_(fmt::format("set-up: {} of {} members made, {} with {:.2f} GB, {:.1f} s",
                          trainers_.size() + workers_.size(), members, member,
                          held_bytes(tensors) / 1e9, set_up_seconds()));
  }

  double set_up_seconds() {
    return std::chrono::duration<double>(env_.clock().now() - began_).count();
  }

  void watch_coordinator() {
    coord_->on_ready = [this](const plan& p) {
      ready_ = true;
      if (progress_)
        progress_(
            fmt::format("set-up: ready after {:.1f} s, every member's staging and host copies made",
                        set_up_seconds()));
      result_.chunks = p.chunks.size();
      result_.stripes = static_cast<std::uint32_t>(p.instances.at(0).leaders.size());
      const auto share = p.receive_shares();
      result_.worker_bytes = share.most_bytes;
      result_.receive_ratio = share.worst_ratio;
      result_.paths = p.paths();
    };
    coord_->on_failed = [this](const std::string& why) { failure_ = why; };
    coord_->on_delivered = [this](const version_report& r) {
      result_.versions.push_back(r);
      if (!progress_) return;
      progress_(
          fmt::format("version {}/{}: {:.2f} GB to {} workers in {:.3f} s ({:.2f} GB/s), trainer "
                      "stalled {:.3f} s{}",
                      r.version, config_.versions, r.bytes / 1e9, r.workers, r.seconds,
                      r.bytes / r.seconds / 1e9, r.offloaded_seconds,
                      config_.verify ? (r.verified ? ", digests match" : ", DIGESTS DIFFER") : ""));
    };
  }

  /// Each version in turn, once the one before is delivered.
  void publish_versions() {
    for (std::uint64_t v = 1; v <= config_.versions && !failure_ && !stopping_; ++v) {
      // "Training" produces version v: new bytes in every trainer tensor, filled on the pool.
      std::size_t filling = 0;
      for (auto& m : memory_) {
        for (auto& t : m.refs) {
          ++filling;
          env_.cpu().async_run(
              t.spec.nbytes,
              [&t, v] {
                fill_version({t.data, t.spec.nbytes}, t.spec.name, v);
              },
              [&] { --filling; });
        }
      }
      loop_.run_until([&] { return filling == 0; });  // the fills touch the trainers' memory
      if (stopping_) break;
      for (auto& t : trainers_) {
        std::string why;
        if (!t->publish(v, why)) failure_ = "publish refused: " + why;
      }
      loop_.run_until([&] { return failure_ || stopping_ || result_.versions.size() == v; });
    }
  }

  /// The last version, byte for byte, on every worker: the part of each tensor it holds.
  void compare_bytes() {
    std::map<std::string, const tensor_ref*> published;
    for (const auto& m : memory_) {
      for (const auto& t : m.refs) published[t.spec.name] = &t;
    }
    for (const auto& w : workers_) {
      for (const auto& dst : w->tensors()) {
        const auto* src = published.at(dst.spec.name);
        const auto part = dst.held();
        if (std::memcmp(src->data + part.offset, dst.data, part.bytes) != 0) {
          result_.verified = false;
          result_.error = "tensor '" + dst.spec.name + "' differs on a worker";
        }
      }
    }
  }

  void finish() {
    if (stopping_ || failure_) {
      // Mid-update: every node closes (its actors' mailboxes, so that what is queued, such as a
      // plan whose staging takes seconds to fault in, is dropped unread; its transport, so that
      // nothing new goes on any wire), and the copies already on the pool land while every
      // buffer they touch still exists. Then the actors unwind.
      for (auto& n : nodes_) n->close();
      env_.wait_idle();
    } else {
      coord_->stop_job();
    }
    workers_.clear();
    trainers_.clear();
    if (config_.trace_path.empty()) return;
    if (auto ec = env_.trace().write_chrome(config_.trace_path)) {
      result_.ok = result_.verified = false;
      result_.error = "cannot write the trace to " + config_.trace_path + ": " + ec.message();
    }
  }

  const job_config& config_;
  const std::function<void(const std::string&)>& progress_;
  std::stop_token stop_;
  job_result result_;
  event_loop loop_;
  real_environment env_{loop_};
  clock::time_point began_;  ///< of the set-up
  bool stopping_ = false;
  std::stop_callback<std::function<void()>> on_stop_;
  transport_settings settings_;
  const std::vector<tensor_spec> model_ = synthetic_transformer(config_.model_bytes);
  std::vector<std::unique_ptr<node>> nodes_;
  std::unique_ptr<job_coordinator> coord_;
  bool ready_ = false;
  std::optional<std::string> failure_;
  std::vector<trainer_memory> memory_;
  std::vector<std::unique_ptr<trainer_shard>> trainers_;
  std::vector<std::unique_ptr<rollout_worker>> workers_;
  std::vector<const node*> worker_nodes_;
};

}  // namespace

job_result run_local_job(const job_config& config,
                         const std::function<void(const std::string&)>& progress,
                         std::stop_token stop) {
  return local_job(config, progress, stop).run();
}

}  // namespace ferry
