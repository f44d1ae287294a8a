#include "jobs/local_job.hpp"

#include <fmt/format.h>

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

}  // namespace

job_result run_local_job(const job_config& config, const std::function<void(const std::string&)>& progress,
                         std::stop_token stop) {
  job_result result;
  event_loop loop;
  real_environment env(loop);
  // A stop request comes from another thread: it wakes the loop, whose waits below all end on it.
  bool stopping = false;
  std::stop_callback on_stop(stop, [&loop, &stopping] { loop.post([&stopping] { stopping = true; }); });
  if (!config.trace_path.empty()) env.trace().keep_records();
  transport_settings settings;
  // One process, one job: a fresh random secret authenticates the tcp links between its nodes.
  std::random_device random;
  for (int i = 0; i < 32; ++i) settings.secret.push_back(static_cast<std::byte>(random()));

  const auto model = synthetic_transformer(config.model_bytes);
  const auto shards = split_over_shards(model, config.trainers);
  for (const auto& t : model) result.model_bytes += t.nbytes;
  result.tensors = model.size();
  result.workers = config.instances * config.workers_per_instance;

  std::vector<std::unique_ptr<node>> nodes;
  auto add_node = [&]() -> node* {
    const auto id = static_cast<node_id>(nodes.size());
    auto t = make_transport(config.transport, env, id, settings);
    if (!t) {
      result.error = "cannot create the " + config.transport + " transport: " + t.error().message();
      return nullptr;
    }
    nodes.push_back(std::make_unique<node>(env, id, *t, protocol()));
    if (auto ec = nodes.back()->start()) {
      result.error = "cannot start node " + std::to_string(id) + ": " + ec.message();
      return nullptr;
    }
    // Every node reaches the coordinator (node 0) first; the plan tells it the others.
    if (id != 0) nodes.back()->transport().add_peer(0, nodes.front()->transport().local_address());
    return nodes.back().get();
  };

  node* coordinator_node = add_node();
  if (!coordinator_node) return result;
  job_coordinator coord(*coordinator_node, 1,
                    job_shape{.trainers = config.trainers,
                              .instance_sizes = std::vector<std::uint32_t>(config.instances, config.workers_per_instance),
                              .chunk_bytes = config.chunk_bytes,
                              .depth = config.depth,
                              .stripes = config.stripes,
                              .shared_host_copies = config.shared_host_copies,
                              // One process: no member can die on its own, and pre-faulting
                              // staging on the shared loop must not look like a hang.
                              .heartbeat_timeout = std::chrono::hours(24)});
  bool ready = false;
  std::optional<std::string> failure;
  coord.on_ready = [&](const plan& p) {
    ready = true;
    result.chunks = p.chunks.size();
    result.stripes = static_cast<std::uint32_t>(p.instances.at(0).leaders.size());
    const auto share = p.receive_shares();
    result.worker_bytes = share.most_bytes;
    result.receive_ratio = share.worst_ratio;
  };
  coord.on_failed = [&](const std::string& why) { failure = why; };
  coord.on_delivered = [&](const version_report& r) {
    result.versions.push_back(r);
    if (progress) {
      progress(fmt::format("version {}/{}: {:.2f} GB to {} workers in {:.3f} s ({:.2f} GB/s), trainer stalled {:.3f} s{}",
                           r.version, config.versions, r.bytes / 1e9, r.workers, r.seconds, r.bytes / r.seconds / 1e9,
                           r.offloaded_seconds, config.verify ? (r.verified ? ", digests match" : ", DIGESTS DIFFER") : ""));
    }
  };
  coord.start();

  const trainer_options trainer_opts{.checksums = config.checksums, .digests = config.verify};
  const worker_options worker_opts{.checksums = config.checksums, .digests = config.verify,
                                   .make_broadcast = host_chain(chain_tag)};
  std::vector<trainer_memory> memory;
  std::vector<std::unique_ptr<trainer_shard>> trainers;
  // Members allocate (and fault in) their memory as they are made, a second or so each for large
  // models: a stop between two of them need not wait for the rest.
  for (std::uint32_t s = 0; s < config.trainers && !stop.stop_requested(); ++s) {
    node* n = add_node();
    if (!n) return result;
    memory.push_back(allocate(shards[s]));
    trainers.push_back(std::make_unique<trainer_shard>(*n, 1, coord.self(), s, memory.back().refs, trainer_opts));
  }
  std::vector<std::unique_ptr<rollout_worker>> workers;
  std::vector<const node*> worker_nodes;
  for (std::uint32_t i = 0; i < config.instances && !stop.stop_requested(); ++i) {
    for (std::uint32_t r = 0; r < config.workers_per_instance && !stop.stop_requested(); ++r) {
      node* n = add_node();
      if (!n) return result;
      worker_nodes.push_back(n);
      workers.push_back(std::make_unique<rollout_worker>(
          *n, 1, coord.self(), i, r, rollout_share(model, config.shard_rollout, r, config.workers_per_instance),
          worker_opts));
    }
  }
  for (auto& t : trainers) t->join();
  for (auto& w : workers) w->join();
  loop.run_until([&] { return ready || failure || stopping; });

  for (std::uint64_t v = 1; v <= config.versions && !failure && !stopping; ++v) {
    // "Training" produces version v: new bytes in every trainer tensor, filled on the pool.
    std::size_t filling = 0;
    for (auto& m : memory) {
      for (auto& t : m.refs) {
        ++filling;
        env.cpu().async_run(
            t.spec.nbytes, [&t, v] { fill_version({t.data, t.spec.nbytes}, t.spec.name, v); }, [&] { --filling; });
      }
    }
    loop.run_until([&] { return filling == 0; });  // the fills touch the trainers' memory
    if (stopping) break;
    for (auto& t : trainers) {
      std::string why;
      if (!t->publish(v, why)) failure = "publish refused: " + why;
    }
    loop.run_until([&] { return failure || stopping || result.versions.size() == v; });
  }

  for (const auto* n : worker_nodes) {
    result.worker_link_bytes =
        std::max<std::uint64_t>(result.worker_link_bytes, n->stats().bytes_in / std::max<std::size_t>(result.versions.size(), 1));
  }
  if (failure) {
    result.error = *failure;
  } else if (stopping && result.versions.size() < config.versions) {
    result.interrupted = true;
    result.error = fmt::format("stopped after {} of {} versions", result.versions.size(), config.versions);
  } else {
    result.ok = true;
    result.verified = config.verify;
    for (const auto& r : result.versions) result.verified = result.verified && r.verified;
    // The last version, byte for byte, on every worker: the part of each tensor it holds.
    std::map<std::string, const tensor_ref*> published;
    for (const auto& m : memory) {
      for (const auto& t : m.refs) published[t.spec.name] = &t;
    }
    for (const auto& w : workers) {
      for (const auto& dst : w->tensors()) {
        const auto* src = published.at(dst.spec.name);
        const auto part = dst.held();
        if (std::memcmp(src->data + part.offset, dst.data, part.bytes) != 0) {
          result.verified = false;
          result.error = "tensor '" + dst.spec.name + "' differs on a worker";
        }
      }
    }
  }
  if (stopping || failure) {
    // Mid-update: every node closes (its actors' mailboxes, so that what is queued, such as a plan
    // whose staging takes seconds to fault in, is dropped unread; its transport, so that nothing
    // new goes on any wire), and the copies already on the pool land while every buffer they
    // touch still exists. Then the actors unwind.
    for (auto& n : nodes) n->close();
    env.wait_idle();
  } else {
    coord.stop_job();
  }
  workers.clear();
  trainers.clear();
  if (!config.trace_path.empty()) {
    if (auto ec = env.trace().write_chrome(config.trace_path)) {
      result.ok = result.verified = false;
      result.error = "cannot write the trace to " + config.trace_path + ": " + ec.message();
    }
  }
  return result;
}

}  // namespace ferry
