// ferry_api_bench's job without the public API: the same table, the same tcp loopback links, the
// same loop thread per member, and the actors (coordinator, trainer shard, rollout workers) driven
// directly, as `ferry node` drives them. Same flags, same JSON line. bench/api_overhead.py runs
// both in alternating rounds: what the public API costs per update.
//
//   ferry_internal_bench [--model-bytes N] [--tensors N] [--chunk-bytes N] [--depth N]
//                        [--workers N] [--versions N] [--checks]
#include <CLI/CLI.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "actors/coordinator.hpp"
#include "actors/rollout_worker.hpp"
#include "actors/trainer_shard.hpp"
#include "api/member_thread.hpp"
#include "bench/bench_job.hpp"
#include "collectives/host/chain_broadcast.hpp"

namespace {

using namespace ferry;

/// What the main thread waits on: the loop threads' callbacks move it.
struct progress {
  std::mutex mutex;
  std::condition_variable changed;
  bool ready = false;
  std::uint64_t delivered = 0;
  std::vector<std::uint64_t> applied;  ///< per rollout
  std::string failure;

  template <class F>
  void update(F&& f) {
    std::lock_guard lock(mutex);
    f();
    changed.notify_all();
  }
  template <class P>
  bool wait(P&& until) {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return until() || !failure.empty(); });
    return failure.empty();
  }
};

std::vector<tensor_ref> refs(std::vector<std::vector<std::byte>>& table) {
  std::vector<tensor_ref> out;
  for (std::size_t i = 0; i < table.size(); ++i) {
    out.push_back({.spec = make_tensor_spec("t" + std::to_string(i), dtype::u8,
                                            {static_cast<std::int64_t>(table[i].size())}),
                   .data = table[i].data()});
  }
  return out;
}

int fail(const std::string& what) {
  std::fprintf(stderr, "ferry_internal_bench: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  bench_job job;
  CLI::App app{
      "ferry_api_bench's job with the actors driven directly; per-version publish-to-delivered "
      "times"};
  job.add_flags(app);
  CLI11_PARSE(app, argc, argv);

  api::link_settings link;
  for (char c : std::string("api-bench-secret-of-enough-bytes"))
    link.secret.push_back(static_cast<std::byte>(c));
  progress state;
  state.applied.assign(job.workers, 0);

  api::member_thread coordinator_thread;
  std::unique_ptr<job_coordinator> coordinator;
  std::string coordinator_address;
  const job_shape shape{.trainers = 1,
                        .instance_sizes = {job.workers},
                        .chunk_bytes = job.chunk_bytes,
                        .depth = job.depth};
  if (auto s = coordinator_thread.start(
          "tcp", coordinator_node, link,
          [&](node& host) -> status {
            coordinator = std::make_unique<job_coordinator>(host, job_actor, shape);
            coordinator->on_failed = [&](const std::string& why) {
              state.update([&] { state.failure = why; });
            };
            coordinator->start();
            coordinator_address = host.transport().local_address();
            return {};
          },
          [&](node&) {
            coordinator->stop_job();
            coordinator.reset();
          });
      !s) {
    return fail("coordinator: " + s.message);
  }
  const address to_coordinator{coordinator_node, job_actor};
  auto reach = [&](node& host) -> status {
    if (auto ec = host.transport().add_peer(coordinator_node, coordinator_address))
      return {ec, ec.message()};
    return {};
  };

  std::vector<std::vector<std::byte>> sent(
      job.tensors, std::vector<std::byte>(job.model_bytes / job.tensors, std::byte{1}));
  api::member_thread trainer_thread;
  std::unique_ptr<trainer_shard> shard;
  if (auto s = trainer_thread.start(
          "tcp", 1, link,
          [&](node& host) -> status {
            if (auto st = reach(host); !st) return st;
            shard = std::make_unique<trainer_shard>(
                host, job_actor, to_coordinator, 0, refs(sent),
                trainer_options{.checksums = job.checks, .digests = job.checks});
            shard->on_ready = [&] { state.update([&] { state.ready = true; }); };
            shard->on_delivered = [&](std::uint64_t v, bool) {
              state.update([&] { state.delivered = v; });
            };
            shard->on_failed = [&](const std::string& why) {
              state.update([&] { state.failure = why; });
            };
            shard->join();
            return {};
          },
          [&](node&) { shard.reset(); });
      !s) {
    return fail("trainer: " + s.message);
  }

  std::vector<std::vector<std::vector<std::byte>>> landing(
      job.workers, std::vector<std::vector<std::byte>>(
                       job.tensors, std::vector<std::byte>(job.model_bytes / job.tensors)));
  std::vector<std::unique_ptr<api::member_thread>> rollout_threads;
  std::vector<std::unique_ptr<rollout_worker>> rollouts(job.workers);
  for (std::uint32_t rank = 0; rank < job.workers; ++rank) {
    rollout_threads.push_back(std::make_unique<api::member_thread>());
    if (auto s = rollout_threads.back()->start(
            "tcp", (1u << 20) + rank, link,
            [&, rank](node& host) -> status {
              if (auto st = reach(host); !st) return st;
              auto& w = rollouts[rank];
              w = std::make_unique<rollout_worker>(
                  host, job_actor, to_coordinator, 0, rank, refs(landing[rank]),
                  worker_options{.checksums = job.checks,
                                 .digests = job.checks,
                                 .make_broadcast = host_chain(chain_tag)});
              w->on_version = [&, rank](std::uint64_t v) {
                state.update([&] { state.applied[rank] = v; });
              };
              w->on_failed = [&](const std::string& why) {
                state.update([&] { state.failure = why; });
              };
              w->join();
              return {};
            },
            [&, rank](node&) { rollouts[rank].reset(); });
        !s) {
      return fail("rollout: " + s.message);
    }
  }
  if (!state.wait([&] { return state.ready; })) return fail(state.failure);

  std::printf("{\"model_bytes\": %llu, \"workers\": %u, \"per_version_s\": [",
              (unsigned long long)job.model_bytes, job.workers);
  for (std::uint64_t v = 1; v <= job.versions; ++v) {
    const auto start = std::chrono::steady_clock::now();
    trainer_thread.post([&, v] {
      std::string why;
      if (!shard->publish(v, why)) state.update([&] { state.failure = "publish: " + why; });
    });
    const bool ok = state.wait([&] {
      if (state.delivered < v) return false;
      for (auto a : state.applied) {
        if (a < v) return false;
      }
      return true;
    });
    if (!ok) return fail(state.failure);
    std::printf("%s%.6f", v > 1 ? ", " : "",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::printf("]}\n");
  for (auto& t : rollout_threads) t->stop();
  trainer_thread.stop();
  coordinator_thread.stop();
  return landing.front() == sent ? 0 : fail("verify: a rollout's bytes differ");
}
