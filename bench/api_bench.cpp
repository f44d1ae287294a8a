// One job through the public C++ API, in one process over tcp loopback: a coordinator, a trainer
// and an instance of rollouts that register where each tensor lands. Prints, as one JSON line, the
// time from publish() to every rollout holding the version, per version. bench/python_bench.py
// runs the same job through the Python module and the verl backend beside it.
//
//   ferry_api_bench [--model-bytes N] [--tensors N] [--chunk-bytes N] [--depth N] [--workers N]
//                   [--versions N] [--checks]
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <ferry/ferry.hpp>
#include <memory>
#include <string>
#include <vector>

#include "bench_job.hpp"

using namespace std::chrono_literals;

namespace {

struct table {
  std::vector<std::vector<std::byte>> tensors;
  table(std::uint64_t model_bytes, std::uint32_t count) {
    for (std::uint32_t i = 0; i < count; ++i)
      tensors.emplace_back(model_bytes / count, std::byte{1});
  }
  std::vector<ferry::tensor> view() {
    std::vector<ferry::tensor> out;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      out.push_back({.name = "t" + std::to_string(i),
                     .dtype = "u8",
                     .shape = {static_cast<std::int64_t>(tensors[i].size())},
                     .data = tensors[i].data()});
    }
    return out;
  }
};

int fail(const char* what, const ferry::status& s) {
  std::fprintf(stderr, "ferry_api_bench: %s: %s\n", what, s.message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  bench_job job;
  CLI::App app{"One job through ferry's public C++ API; per-version publish-to-delivered times"};
  job.add_flags(app);
  CLI11_PARSE(app, argc, argv);

  const std::string secret = "api-bench-secret-of-enough-bytes";
  ferry::status ok;
  ferry::coordinator coordinator({.secret = secret,
                                  .instance_sizes = {job.workers},
                                  .chunk_bytes = job.chunk_bytes,
                                  .depth = job.depth},
                                 ok);
  if (!ok) return fail("coordinator", ok);
  const ferry::member_options member{.coordinator = coordinator.address(),
                                     .secret = secret,
                                     .checksums = job.checks,
                                     .digests = job.checks};

  table sent(job.model_bytes, job.tensors);
  ferry::trainer trainer({member});
  for (const auto& t : sent.view()) {
    if (auto s = trainer.register_tensor(t); !s) return fail("register", s);
  }
  std::vector<std::unique_ptr<table>> landing;
  std::vector<std::unique_ptr<ferry::rollout>> rollouts;
  for (std::uint32_t rank = 0; rank < job.workers; ++rank) {
    landing.push_back(std::make_unique<table>(job.model_bytes, job.tensors));
    rollouts.push_back(std::make_unique<ferry::rollout>(ferry::rollout::options{member, 0, rank}));
    for (const auto& t : landing.back()->view()) {
      if (auto s = rollouts.back()->register_tensor(t); !s) return fail("register", s);
    }
  }
  if (auto s = trainer.join(); !s) return fail("join", s);
  for (auto& r : rollouts) {
    if (auto s = r->join(); !s) return fail("join", s);
  }

  std::printf("{\"model_bytes\": %llu, \"workers\": %u, \"per_version_s\": [",
              (unsigned long long)job.model_bytes, job.workers);
  for (std::uint64_t v = 1; v <= job.versions; ++v) {
    const auto start = std::chrono::steady_clock::now();
    ferry::trainer::update u(nullptr);
    if (auto s = trainer.publish(v, &u); !s) return fail("publish", s);
    if (auto s = u.wait_delivered(600s); !s) return fail("deliver", s);
    for (auto& r : rollouts) {
      if (auto s = r->wait_version(v, 600s); !s) return fail("wait_version", s);
    }
    std::printf("%s%.6f", v > 1 ? ", " : "",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::printf("]}\n");
  return landing.front()->tensors == sent.tensors
             ? 0
             : fail("verify", {{}, "a rollout's bytes differ"});
}
