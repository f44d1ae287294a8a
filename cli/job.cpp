/// Multi-process jobs: `ferry coordinator`, `ferry node` (one actor per process) and the
/// `ferry local` launcher that starts a whole job of separate processes on this host.
#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include "actors/rollout_worker.hpp"
#include "actors/synthetic_model.hpp"
#include "actors/trainer_shard.hpp"
#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "cli/report.hpp"
#include "runtime/host_buffer.hpp"
#include "runtime/log.hpp"
#include "runtime/node.hpp"
#include "transport/factory.hpp"
#include "transport/tcp/link_auth.hpp"

extern char** environ;

namespace ferry::cli {
namespace {

constexpr node_id coordinator_node = 0;
constexpr actor_id job_actor = 1;

/// Flags every process of a multi-process job shares.
struct process_flags {
  job_config job;
  std::string coordinator_address;
  std::string address_file;
  bool allow_unauthenticated = false;
  double timeout_seconds = 600;
  bool json = false;
  std::string fabric_provider;
};

void add_process_flags(CLI::App& app, process_flags& f) {
  add_job_options(app, f.job);
  app.add_flag("--allow-unauthenticated", f.allow_unauthenticated,
               "run tcp links without a job secret (otherwise FERRY_SECRET or FERRY_SECRET_FILE is required)");
  app.add_option("--fabric-provider", f.fabric_provider, "libfabric provider for --transport fabric (e.g. shm, 'tcp;ofi_rxm')");
  app.add_option("--timeout", f.timeout_seconds, "give up after this many seconds")->check(CLI::PositiveNumber)
      ->capture_default_str();
}

/// The transport environment of a job process: the job secret comes from the environment only.
std::optional<std::string> prepare_environment(const process_flags& f, transport_environment& env) {
  if (f.job.transport == "inproc") return "--transport inproc cannot span processes; use tcp or fabric";
  env.allow_unauthenticated = f.allow_unauthenticated;
  env.fabric_provider = f.fabric_provider;
  if (f.job.transport == "tcp" && !f.allow_unauthenticated) {
    auto secret = load_job_secret();
    if (!secret) return "no job secret: set FERRY_SECRET_FILE (or FERRY_SECRET): " + secret.error().message();
    env.secret = *secret;
  }
  return std::nullopt;
}

/// Runs the loop until `done` or the timeout; false on timeout.
bool run_with_timeout(event_loop& loop, const process_flags& f, const std::function<bool()>& done) {
  bool expired = false;
  real_clock clock(loop.io());
  const auto timer = clock.async_wait(std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(f.timeout_seconds)),
                                      [&](std::error_code ec) { expired = !ec; });
  loop.run_until([&] { return expired || done(); });
  clock.cancel(timer);
  loop.io().poll();
  return !expired;
}

int run_coordinator(const process_flags& f) {
  transport_environment env;
  if (auto error = prepare_environment(f, env)) return std::fprintf(stderr, "ferry coordinator: %s\n", error->c_str()), 2;
  event_loop loop;
  auto t = make_transport(f.job.transport, loop, coordinator_node, env);
  if (!t) return std::fprintf(stderr, "ferry coordinator: cannot open the transport: %s\n", t.error().message().c_str()), 1;
  node host(loop, coordinator_node, *t, protocol());
  if (auto ec = host.start()) return std::fprintf(stderr, "ferry coordinator: %s\n", ec.message().c_str()), 1;

  coordinator coord(host, job_actor,
                    job_shape{.trainers = f.job.trainers,
                              .instance_sizes = std::vector<std::uint32_t>(f.job.instances, f.job.workers_per_instance),
                              .chunk_bytes = f.job.chunk_bytes,
                              .depth = f.job.depth});
  job_result result;
  result.workers = f.job.instances * f.job.workers_per_instance;
  std::optional<std::string> failure;
  coord.on_ready = [&](const plan& p) {
    result.model_bytes = p.total_bytes();
    result.tensors = p.tensors.size();
    result.chunks = p.chunks.size();
    log::info("coordinator: every leader is ready; updates may start");
  };
  coord.on_failed = [&](const std::string& why) { failure = why; };
  coord.on_delivered = [&](const version_report& r) {
    result.versions.push_back(r);
    log::info("version {}/{}: {:.2f} GB to {} workers in {:.3f} s ({:.2f} GB/s), trainer stalled {:.3f} s{}", r.version,
              f.job.versions, r.bytes / 1e9, r.workers, r.seconds, r.bytes / r.seconds / 1e9, r.offloaded_seconds,
              r.verified ? ", digests match" : "");
  };
  coord.start();

  const std::string address = host.transport().local_address();
  if (!f.address_file.empty()) {
    const auto tmp = f.address_file + ".tmp";
    std::ofstream(tmp) << address << "\n";
    std::filesystem::rename(tmp, f.address_file);
  }
  log::info("coordinator: listening at {}", address);

  const bool finished = run_with_timeout(loop, f, [&] { return failure || result.versions.size() >= f.job.versions; });
  coord.stop_job();
  run_with_timeout(loop, {.timeout_seconds = 0.2}, [] { return false; });  // let job_stop leave
  log::set_level(log::level::error);  // from here on, peers leaving is the plan, not news
  if (!finished) failure = fmt::format("timed out after {} s with {} of {} versions delivered", f.timeout_seconds,
                                       result.versions.size(), f.job.versions);
  result.ok = !failure;
  result.verified = result.ok && f.job.verify;
  for (const auto& v : result.versions) result.verified = result.verified && v.verified;
  if (failure) result.error = *failure;
  std::printf("%s", f.json ? (summary_json(result).dump() + "\n").c_str() : summary_table(result).c_str());
  std::fflush(stdout);
  return result.ok && (result.verified || !f.job.verify) ? 0 : 1;
}

struct node_flags {
  process_flags common;
  std::string role;
  node_id id = 1;
  std::uint32_t shard = 0, instance = 0, rank = 0;
};

int run_node(const node_flags& f) {
  transport_environment env;
  if (auto error = prepare_environment(f.common, env)) return std::fprintf(stderr, "ferry node: %s\n", error->c_str()), 2;
  event_loop loop;
  auto t = make_transport(f.common.job.transport, loop, f.id, env);
  if (!t) return std::fprintf(stderr, "ferry node: cannot open the transport: %s\n", t.error().message().c_str()), 1;
  node host(loop, f.id, *t, protocol());
  if (auto ec = host.start()) return std::fprintf(stderr, "ferry node: %s\n", ec.message().c_str()), 1;
  if (auto ec = host.transport().add_peer(coordinator_node, f.common.coordinator_address)) {
    return std::fprintf(stderr, "ferry node: --coordinator '%s': %s\n", f.common.coordinator_address.c_str(),
                        ec.message().c_str()), 2;
  }
  const address coordinator_address{coordinator_node, job_actor};
  host_copy_engine copies(loop);
  const auto& job = f.common.job;
  const auto model = synthetic_transformer(job.model_bytes);

  std::optional<std::string> failure;
  bool stopped = false;
  auto watch_stop = [&](actor& a) {
    a.on<job_stop>([&](const envelope_header&, const job_stop&) { stopped = true; });
  };

  if (f.role == "trainer") {
    const auto shards = split_over_shards(model, job.trainers);
    if (f.shard >= shards.size()) return std::fprintf(stderr, "ferry node: --shard %u: the job has %u\n", f.shard, job.trainers), 2;
    std::vector<host_buffer> storage;
    std::vector<tensor_ref> tensors;
    for (const auto& s : shards[f.shard]) {
      storage.emplace_back(s.nbytes);
      tensors.push_back({.spec = s, .data = storage.back().data()});
    }
    trainer_shard shard(host, job_actor, coordinator_address, f.shard, tensors, copies,
                        {.checksums = job.checksums, .digests = job.verify});
    watch_stop(shard);
    shard.on_failed = [&](const std::string& why) { failure = why; };
    // The "training loop": produce version v, publish it, train on once offloaded.
    std::uint64_t version = 0;
    auto publish_next = [&] {
      if (version >= job.versions) return;
      ++version;
      for (auto& t : tensors) fill_version({t.data, t.spec.nbytes}, t.spec.name, version);
      std::string why;
      if (!shard.publish(version, why)) failure = "publish refused: " + why;
    };
    shard.on_ready = publish_next;
    shard.on_delivered = [&](std::uint64_t, bool) { publish_next(); };
    shard.join();
    run_with_timeout(loop, f.common, [&] { return stopped || failure.has_value() || shard.failed(); });
  } else {
    std::vector<tensor_ref> destinations;
    for (const auto& t : model) destinations.push_back({.spec = t});
    rollout_worker worker(host, job_actor, coordinator_address, f.instance, f.rank, destinations, copies,
                          {.checksums = job.checksums, .digests = job.verify});
    watch_stop(worker);
    worker.on_failed = [&](const std::string& why) { failure = why; };
    worker.on_version = [&](std::uint64_t v) { log::debug("worker {}.{}: version {} applied", f.instance, f.rank, v); };
    worker.join();
    run_with_timeout(loop, f.common, [&] { return stopped || failure.has_value(); });
  }
  if (failure) log::error("node {}: {}", f.id, *failure);
  log::set_level(log::level::error);  // peers leaving after job_stop is the plan, not news
  return failure ? 1 : 0;
}

/// Starts `args` as a child process with `env_extra` added; returns its pid or -1.
pid_t spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

std::vector<std::string> job_args(const std::string& self, const std::string& command, const job_config& j) {
  return {self, command, "--trainers", std::to_string(j.trainers), "--instances", std::to_string(j.instances),
          "--workers", std::to_string(j.workers_per_instance), "--model-bytes", std::to_string(j.model_bytes),
          "--chunk-bytes", std::to_string(j.chunk_bytes), "--depth", std::to_string(j.depth), "--versions",
          std::to_string(j.versions), "--transport", j.transport};
}

int run_local(const process_flags& f) {
  if (auto error = check_job_options(f.job); !error.empty()) return std::fprintf(stderr, "ferry local: %s\n", error.c_str()), 2;
  if (f.job.transport == "inproc") return std::fprintf(stderr, "ferry local: --transport must be tcp or fabric\n"), 2;
  const auto self = std::filesystem::read_symlink("/proc/self/exe").string();
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("ferry-local-{}", getpid());
  std::filesystem::create_directories(dir);
  // A fresh job secret, readable by this user only, handed to the children through the environment.
  const auto secret_file = dir / "secret";
  {
    std::random_device random;
    std::ofstream out(secret_file, std::ios::binary);
    for (int i = 0; i < 32; ++i) out.put(static_cast<char>(random()));
  }
  std::filesystem::permissions(secret_file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  setenv("FERRY_SECRET_FILE", secret_file.c_str(), 1);
  const auto address_file = (dir / "coordinator").string();

  auto extra = [&](std::vector<std::string> args) {
    if (!f.job.checksums) args.push_back("--no-checksums");
    if (!f.job.verify) args.push_back("--no-verify");
    args.insert(args.end(), {"--timeout", std::to_string(f.timeout_seconds)});
    if (!f.fabric_provider.empty()) args.insert(args.end(), {"--fabric-provider", f.fabric_provider});
    return args;
  };
  auto coordinator_args = extra(job_args(self, "coordinator", f.job));
  coordinator_args.insert(coordinator_args.end(), {"--address-file", address_file});
  if (f.json) coordinator_args.push_back("--json");
  const pid_t coordinator_pid = spawn(coordinator_args);
  std::vector<pid_t> children;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!std::filesystem::exists(address_file) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string address;
  std::ifstream(address_file) >> address;
  int status = 1;
  if (coordinator_pid > 0 && !address.empty()) {
    node_id next = 1;
    auto start_node = [&](std::vector<std::string> role) {
      auto args = extra(job_args(self, "node", f.job));
      args.insert(args.end(), {"--coordinator", address, "--node-id", std::to_string(next++)});
      args.insert(args.end(), role.begin(), role.end());
      children.push_back(spawn(args));
    };
    for (std::uint32_t s = 0; s < f.job.trainers; ++s) start_node({"--role", "trainer", "--shard", std::to_string(s)});
    for (std::uint32_t i = 0; i < f.job.instances; ++i) {
      for (std::uint32_t r = 0; r < f.job.workers_per_instance; ++r) {
        start_node({"--role", "worker", "--instance", std::to_string(i), "--rank", std::to_string(r)});
      }
    }
    log::info("local: started a coordinator and {} nodes", children.size());
    int raw = 0;
    waitpid(coordinator_pid, &raw, 0);
    status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 1;
  } else {
    std::fprintf(stderr, "ferry local: the coordinator did not start\n");
    if (coordinator_pid > 0) kill(coordinator_pid, SIGKILL);
  }
  // Nodes leave on job_stop; give them a moment, then make sure none is left behind.
  const auto grace = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (pid_t pid : children) {
    int raw = 0;
    while (pid > 0 && waitpid(pid, &raw, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > grace) {
        kill(pid, SIGKILL);
        waitpid(pid, &raw, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  std::filesystem::remove_all(dir);
  return status;
}

}  // namespace

void add_jobs(CLI::App& app, command_table& commands) {
  auto* coord = app.add_subcommand("coordinator", "the coordinator of a multi-process job");
  auto cf = std::make_shared<process_flags>();
  cf->job.transport = "tcp";
  add_process_flags(*coord, *cf);
  coord->add_option("--address-file", cf->address_file, "write the coordinator's transport address here");
  coord->add_flag("--json", cf->json, "print one JSON object instead of the table");
  commands[coord] = [cf] { return run_coordinator(*cf); };

  auto* node_cmd = app.add_subcommand("node", "one trainer shard or rollout worker of a multi-process job");
  auto nf = std::make_shared<node_flags>();
  nf->common.job.transport = "tcp";
  add_process_flags(*node_cmd, nf->common);
  node_cmd->add_option("--coordinator", nf->common.coordinator_address, "the coordinator's transport address")->required();
  node_cmd->add_option("--role", nf->role, "trainer or worker")->required()->check(CLI::IsMember({"trainer", "worker"}));
  node_cmd->add_option("--node-id", nf->id, "this node's id, unique in the job (0 is the coordinator)")
      ->required()->check(CLI::Range(1u, 1u << 30));
  node_cmd->add_option("--shard", nf->shard, "trainer: the shard this process owns");
  node_cmd->add_option("--instance", nf->instance, "worker: its instance");
  node_cmd->add_option("--rank", nf->rank, "worker: its rank in the instance");
  commands[node_cmd] = [nf] { return run_node(*nf); };

  auto* local = app.add_subcommand("local", "a whole job of separate processes on this host");
  auto lf = std::make_shared<process_flags>();
  lf->job.transport = "tcp";
  add_process_flags(*local, *lf);
  local->add_flag("--json", lf->json, "print one JSON object instead of the table");
  commands[local] = [lf] { return run_local(*lf); };
}

}  // namespace ferry::cli
