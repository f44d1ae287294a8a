// A trainer process publishes versions of its tensors to two rollout processes over tcp, with the
// job's coordinator inside the trainer process; each rollout checks every byte of every version.
//
//   trainer_and_rollout [VERSIONS]     starts both rollout processes itself and runs the trainer
//
// The job secret comes from FERRY_SECRET (set here when missing, for the demonstration).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ferry/ferry.hpp>
#include <map>
#include <mutex>
#include <string>
#include <vector>

extern char** environ;

namespace {

using namespace std::chrono_literals;

// The "model": an embedding and one layer's weights, whose values say which version they hold.
struct model {
  std::vector<float> embedding = std::vector<float>(4096 * 64);
  std::vector<float> weight = std::vector<float>(512 * 1000 + 3);
  void fill(std::uint64_t version) {
    for (std::size_t i = 0; i < embedding.size(); ++i)
      embedding[i] = float(version) + float(i % 1000) * 1e-3f;
    for (std::size_t i = 0; i < weight.size(); ++i)
      weight[i] = -float(version) - float(i % 777) * 1e-3f;
  }
  std::vector<ferry::tensor> tensors() {
    return {{.name = "embedding", .dtype = "f32", .shape = {4096, 64}, .data = embedding.data()},
            {.name = "layer0.weight",
             .dtype = "f32",
             .shape = {512 * 1000 + 3},
             .data = weight.data()}};
  }
};

int fail(const char* what, const ferry::status& s) {
  std::fprintf(stderr, "%s: %s\n", what, s.message.c_str());
  return 1;
}

int run_rollout(const std::string& coordinator, std::uint32_t rank, std::uint64_t versions) {
  model got, expected;
  ferry::rollout r({{.coordinator = coordinator}, 0, rank});
  for (const auto& t : got.tensors()) {
    if (auto s = r.register_tensor(t); !s) return fail("register", s);
  }
  // A later version may land as soon as every rollout holds this one: compare inside on_version,
  // during which nothing lands.
  std::mutex m;
  std::condition_variable checked;
  std::map<std::uint64_t, bool> same;
  r.on_version([&](std::uint64_t v) {
    expected.fill(v);
    const bool equal = got.embedding == expected.embedding && got.weight == expected.weight;
    std::lock_guard lock(m);
    same[v] = equal;
    checked.notify_all();
  });
  if (auto s = r.join(); !s) return fail("join", s);
  for (std::uint64_t v = 1; v <= versions; ++v) {
    if (auto s = r.wait_version(v, 60s); !s) return fail("wait_version", s);
    std::unique_lock lock(m);
    checked.wait(lock, [&] { return same.contains(v); });
    if (!same[v]) {
      std::fprintf(stderr, "rollout %u: version %llu differs from the trainer's\n", rank,
                   (unsigned long long)v);
      return 1;
    }
    std::printf("rollout %u: version %llu verified\n", rank, (unsigned long long)v);
    std::fflush(stdout);
  }
  return 0;
}

pid_t spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  return posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) == 0 ? pid : -1;
}

int run_trainer(const char* self, std::uint64_t versions) {
  ferry::status ok;
  ferry::coordinator coordinator({.trainers = 1, .instance_sizes = {2}, .chunk_bytes = 256 * 1024},
                                 ok);
  if (!ok) return fail("coordinator", ok);
  std::vector<pid_t> rollouts;
  for (int rank = 0; rank < 2; ++rank) {
    rollouts.push_back(spawn(
        {self, "rollout", coordinator.address(), std::to_string(rank), std::to_string(versions)}));
  }

  model weights;
  ferry::trainer trainer({{.coordinator = coordinator.address()}});
  for (const auto& t : weights.tensors()) {
    if (auto s = trainer.register_tensor(t); !s) return fail("register", s);
  }
  if (auto s = trainer.join(); !s) return fail("join", s);
  int status = 0;
  for (std::uint64_t v = 1; v <= versions && status == 0; ++v) {
    weights.fill(v);  // a training step
    ferry::trainer::update u(nullptr);
    if (auto s = trainer.publish(v, &u); !s) return fail("publish", s);
    if (auto s = u.wait_offloaded(60s); !s)
      return fail("offload", s);  // from here the step may write again
    if (auto s = u.wait_delivered(60s); !s) return fail("deliver", s);
    std::printf("trainer: version %llu delivered\n", (unsigned long long)v);
    std::fflush(stdout);
  }
  for (auto pid : rollouts) {
    int raw = 0;
    if (pid < 0 || waitpid(pid, &raw, 0) != pid || !WIFEXITED(raw) || WEXITSTATUS(raw) != 0)
      status = 1;
  }
  std::printf("%s\n", status == 0 ? "every version delivered and verified" : "a rollout failed");
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  setenv("FERRY_SECRET", "an-example-secret-of-enough-bytes", 0);
  if (argc == 5 && std::string(argv[1]) == "rollout") {
    return run_rollout(argv[2], static_cast<std::uint32_t>(std::stoul(argv[3])),
                       std::stoull(argv[4]));
  }
  return run_trainer("/proc/self/exe", argc > 1 ? std::stoull(argv[1]) : 5);
}
