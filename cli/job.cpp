/// Multi-process jobs: `ferry coordinator`, `ferry node` (one actor per process) and the
/// `ferry local` launcher that starts a whole job of separate processes on this host
/// (`ferry chaos`, which kills some of them, is in chaos.cpp).
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <thread>

#include "actors/rollout_worker.hpp"
#include "actors/synthetic_model.hpp"
#include "actors/trainer_shard.hpp"
#include "cli/commands.hpp"
#include "cli/gpu.hpp"
#include "cli/interrupt.hpp"
#include "cli/job.hpp"
#include "cli/launch.hpp"
#include "cli/options.hpp"
#include "cli/report.hpp"
#include "ferry/ferry.hpp"
#include "runtime/host_buffer.hpp"
#include "runtime/log.hpp"
#include "runtime/node.hpp"
#include "collectives/host/chain_broadcast.hpp"
#include "platform/real_environment.hpp"
#include "transport/factory.hpp"
#include "transport/link_auth.hpp"

namespace ferry::cli {
namespace {

constexpr node_id coordinator_node = 0;
constexpr actor_id job_actor = 1;

/// The transport environment of a job process: the job secret comes from the environment only.
std::optional<std::string> prepare_environment(const process_flags& f, transport_settings& env) {
  // Bad values fail here, at once, rather than as a refused plan after every node registered.
  if (auto error = check_job_options(f.job); !error.empty()) return error;
  if (f.job.transport == "inproc") return "--transport inproc cannot span processes; use tcp, cma or fabric";
  env.allow_unauthenticated = f.allow_unauthenticated;
  env.fabric_provider = f.fabric_provider;
  env.bind_host = f.bind_host;
  if (f.job.transport != "inproc" && !f.allow_unauthenticated) {
    auto secret = load_job_secret();
    if (!secret) {
      // Name where the secret was looked for, never its bytes.
      const char* file = std::getenv("FERRY_SECRET_FILE");
      const std::string source = file && *file ? fmt::format("FERRY_SECRET_FILE '{}'", file) : "FERRY_SECRET";
      const bool short_secret = secret.error() == errc::invalid_argument;
      return fmt::format("{}: {}", source,
                         short_secret ? fmt::format("the job secret must be at least {} bytes", min_secret_bytes)
                                      : secret.error().message());
    }
    if (secret->empty()) return "no job secret: set FERRY_SECRET_FILE (or FERRY_SECRET), or pass --allow-unauthenticated";
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

/// Keeps `env`'s timeline and writes it to `path` (when not empty) as the process's job ends.
class trace_on_exit {
 public:
  trace_on_exit(environment& env, std::string path) : env_(env), path_(std::move(path)) {
    if (!path_.empty()) env_.trace().keep_records();
  }
  ~trace_on_exit() {
    if (path_.empty()) return;
    if (auto ec = env_.trace().write_chrome(path_)) log::error("cannot write the trace to {}: {}", path_, ec.message());
  }

 private:
  environment& env_;
  std::string path_;
};

int run_coordinator(const process_flags& f) {
  transport_settings env;
  if (auto error = prepare_environment(f, env)) return std::fprintf(stderr, "ferry coordinator: %s\n", error->c_str()), 2;
  event_loop loop;
  real_environment environment(loop);
  const trace_on_exit trace(environment, f.job.trace_path);
  // SIGINT or SIGTERM: the job stops (its nodes are told), and so does this process.
  bool interrupted = false;
  std::stop_callback on_interrupt(interrupt_token(), [&] { loop.post([&] { interrupted = true; }); });
  auto t = make_transport(f.job.transport, environment, coordinator_node, env);
  if (!t) return std::fprintf(stderr, "ferry coordinator: cannot open the transport: %s\n", t.error().message().c_str()), 1;
  node host(environment, coordinator_node, *t, protocol());
  if (auto ec = host.start()) return std::fprintf(stderr, "ferry coordinator: %s\n", ec.message().c_str()), 1;

  job_shape shape{.trainers = f.job.trainers,
                  .instance_sizes = std::vector<std::uint32_t>(f.job.instances, f.job.workers_per_instance),
                  .chunk_bytes = f.job.chunk_bytes,
                  .depth = f.job.depth,
                  .stripes = f.job.stripes,
                  .shared_host_copies = f.job.shared_host_copies};
  // GPU nodes pin tens of GiB on their loop thread at plan time: give their heartbeats room.
  shape.heartbeat_timeout = std::chrono::milliseconds(static_cast<long>(f.heartbeat_timeout_s * 1000));
  job_coordinator coord(host, job_actor, shape);
  job_result result;
  result.workers = f.job.instances * f.job.workers_per_instance;
  std::optional<std::string> failure;
  coord.on_ready = [&](const plan& p) {
    result.model_bytes = p.total_bytes();
    result.tensors = p.tensors.size();
    result.chunks = p.chunks.size();
    const auto share = p.receive_shares();
    result.worker_bytes = share.most_bytes;
    result.receive_ratio = share.worst_ratio;
    log::info("coordinator: every leader is ready; updates may start");
  };
  coord.on_failed = [&](const std::string& why) { failure = why; };
  // --events: one JSON line per update, delivery and regroup on stdout, for `ferry chaos`.
  auto event = [&](nlohmann::json e) {
    if (!f.events) return;
    std::printf("%s\n", e.dump().c_str());
    std::fflush(stdout);
  };
  std::vector<double> regroup_ms;
  coord.on_delivered = [&](const version_report& r) {
    result.versions.push_back(r);
    log::info("version {}/{}: {:.2f} GB to {} workers in {:.3f} s ({:.2f} GB/s), trainer stalled {:.3f} s{}", r.version,
              f.job.versions, r.bytes / 1e9, r.workers, r.seconds, r.bytes / r.seconds / 1e9, r.offloaded_seconds,
              r.verified ? ", digests match" : "");
    event({{"event", "delivered"}, {"version", r.version}, {"seconds", r.seconds}, {"verified", r.verified}});
  };
  coord.on_update = [&](std::uint64_t version, bool catch_up, const std::vector<node_id>& leaders) {
    event({{"event", "update"}, {"version", version}, {"catch_up", catch_up}, {"leaders", leaders}});
  };
  coord.on_regroup = [&](const regroup_report& r) {
    regroup_ms.push_back(r.milliseconds);
    event({{"event", "regroup"}, {"epoch", r.epoch}, {"ms", r.milliseconds}, {"reason", r.reason},
           {"leaders_lost_mid_update", r.leaders_lost_mid_update}, {"leaders", r.leaders}});
  };
  coord.on_update_failed = [&](std::uint64_t version, const std::string& why) {
    event({{"event", "update_failed"}, {"version", version}, {"reason", why}});
  };
  coord.start();

  const std::string address = host.transport().local_address();
  if (!f.address_file.empty()) {
    const auto tmp = f.address_file + ".tmp";
    std::ofstream(tmp) << address << "\n";
    std::filesystem::rename(tmp, f.address_file);
  }
  log::info("coordinator: listening at {}", address);

  // Done when enough versions are delivered and no late joiner is still catching up.
  const bool finished = run_with_timeout(
      loop, f, [&] { return interrupted || failure || (result.versions.size() >= f.job.versions && coord.idle()); });
  coord.stop_job();
  run_with_timeout(loop, {.timeout_seconds = 0.2}, [] { return false; });  // let job_stop leave
  log::set_level(log::level::error);  // from here on, peers leaving is the plan, not news
  if (interrupted && !failure) {
    failure = fmt::format("stopped by {} with {} of {} versions delivered", interrupt_name(), result.versions.size(),
                          f.job.versions);
  }
  if (!finished) failure = fmt::format("timed out after {} s with {} of {} versions delivered", f.timeout_seconds,
                                       result.versions.size(), f.job.versions);
  result.ok = !failure;
  result.verified = result.ok && f.job.verify;
  for (const auto& v : result.versions) result.verified = result.verified && v.verified;
  result.verified = result.verified && coord.digest_mismatches() == 0;
  if (failure) result.error = *failure;
  auto summary = summary_json(result);
  std::sort(regroup_ms.begin(), regroup_ms.end());
  summary["regroups"] = coord.regroups();
  summary["regroup_ms_median"] = regroup_ms.empty() ? 0.0 : regroup_ms[regroup_ms.size() / 2];
  summary["regroup_ms_max"] = regroup_ms.empty() ? 0.0 : regroup_ms.back();
  std::printf("%s", f.json ? (summary.dump() + "\n").c_str() : summary_table(result).c_str());
  std::fflush(stdout);
  if (interrupted) return interrupted_exit_code();
  return result.ok && (result.verified || !f.job.verify) ? 0 : 1;
}

struct node_flags {
  process_flags common;
  std::string role;
  node_id id = 1;
  std::uint32_t shard = 0, instance = 0, rank = 0;
  int device = -1;  ///< the GPU this process's tensors live on; -1: host memory
};

/// The coordinator's address as the public API names it: the transport's scheme, then its address.
std::string coordinator_uri(const process_flags& f) {
  if (f.job.transport == "fabric") return "fabric://" + f.fabric_provider + "/" + f.coordinator_address;
  return f.job.transport + "://" + f.coordinator_address;
}

/// `t` as the public API takes it.
ferry::tensor api_tensor(const tensor_ref& t) {
  return {.name = t.spec.name,
          .dtype = std::string(dtype_name(t.spec.type)),
          .shape = {t.spec.shape.begin(), t.spec.shape.end()},
          .data = t.data,
          .device = t.device};
}

/// Registers what a worker holds: whole tensors, or a row range (tensor-parallel sharding).
ferry::status register_share(ferry::rollout& rollout, const tensor_ref& t) {
  const auto held = t.held();
  if (held.bytes == t.spec.nbytes || t.spec.shape.empty()) return rollout.register_tensor(api_tensor(t));
  const auto row_bytes = t.spec.nbytes / static_cast<std::uint64_t>(t.spec.shape[0]);
  return rollout.register_rows(api_tensor(t), static_cast<std::int64_t>(held.offset / row_bytes),
                               static_cast<std::int64_t>(held.bytes / row_bytes));
}

/// A `ferry node` is a program that embeds ferry through its public API, as a trainer or an
/// inference engine would: it registers the synthetic model's tensors (host memory, or its GPU's)
/// and publishes versions of them, or receives them, until the coordinator ends the job.
int run_node(const node_flags& f) {
  transport_settings env;
  if (auto error = prepare_environment(f.common, env)) return std::fprintf(stderr, "ferry node: %s\n", error->c_str()), 2;
  const auto& job = f.common.job;
  const auto model = f.common.model == "llama3-8b" ? llama3_8b() : synthetic_transformer(job.model_bytes);
  // The secret prepare_environment read and checked, passed on rather than read again.
  const ferry::member_options member{.coordinator = coordinator_uri(f.common),
                                     .secret = std::string(reinterpret_cast<const char*>(env.secret.data()),
                                                           env.secret.size()),
                                     .allow_unauthenticated = f.common.allow_unauthenticated,
                                     .node_id = f.id,
                                     .checksums = job.checksums,
                                     .digests = job.verify,
                                     .listen_host = f.common.bind_host,
                                     .trace_file = job.trace_path};
  std::unique_ptr<device_tensors> on_gpu;
  if (f.device >= 0) {
    if (f.device >= visible_gpus())
      return std::fprintf(stderr, "ferry node: --device %d: this host has %d CUDA devices\n", f.device, visible_gpus()), 2;
    on_gpu = std::make_unique<device_tensors>(f.device);
  }

  // SIGINT or SIGTERM: leave the job (closing the member), which regroups without this node,
  // rather than vanish; then exit 128 + the signal. Every wait below is cut in short slices.
  std::atomic<bool> interrupted{false};
  std::stop_callback on_interrupt(interrupt_token(), [&] { interrupted = true; });
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(f.common.timeout_seconds));
  std::optional<std::string> failure;
  // Runs `wait(slice)` until it answers, this node is interrupted (nullopt) or --timeout passes
  // (a failure: the job is still on, or never began).
  auto await = [&](auto wait) -> std::optional<ferry::status> {
    while (!interrupted) {
      if (std::chrono::steady_clock::now() >= deadline) {
        failure = fmt::format("timed out after {} s without the job's end (coordinator {})", f.common.timeout_seconds,
                              f.common.coordinator_address);
        return std::nullopt;
      }
      if (auto s = wait(std::chrono::milliseconds(50)); s.code != ferry::api_errc::timed_out) return s;
    }
    return std::nullopt;
  };
  // The job's end: the coordinator stops it once its versions are delivered.
  auto until_the_end = [&](auto& joined_member) {
    if (auto s = await([&](auto slice) { return joined_member.wait_end(slice); }); s && !*s) failure = s->message;
  };
  // A bad --coordinator is a usage error (exit 2); anything else fails the node.
  auto joined = [&](const ferry::status& s) {
    if (s.code == ferry::api_errc::invalid_argument) {
      std::fprintf(stderr, "ferry node: --coordinator '%s': %s\n", f.common.coordinator_address.c_str(), s.message.c_str());
      return std::optional<int>(2);
    }
    if (!s) failure = s.message;
    return std::optional<int>();
  };

  if (f.role == "trainer") {
    const auto shards = split_over_shards(model, job.trainers);
    if (f.shard >= shards.size()) return std::fprintf(stderr, "ferry node: --shard %u: the job has %u\n", f.shard, job.trainers), 2;
    std::vector<host_buffer> storage;  // the tensors, or on a GPU the host bytes uploaded into them
    std::vector<tensor_ref> tensors;
    for (const auto& s : shards[f.shard]) {
      storage.emplace_back(s.nbytes);
      tensors.push_back({.spec = s, .data = storage.back().data()});
    }
    std::string why;
    if (on_gpu && (tensors = on_gpu->allocate(tensors, why)).empty()) return std::fprintf(stderr, "ferry node: %s\n", why.c_str()), 1;
    ferry::trainer trainer({member, f.shard});
    for (const auto& t : tensors) {
      if (auto s = trainer.register_tensor(api_tensor(t)); !s) return std::fprintf(stderr, "ferry node: %s\n", s.message.c_str()), 2;
    }
    if (auto usage = joined(trainer.join())) return *usage;
    if (!failure) {
      if (auto ready = await([&](auto slice) { return trainer.wait_ready(slice); }); ready && !*ready) failure = ready->message;
    }
    // The "training loop": produce version v, publish it, and once it is delivered the next; until
    // --versions are delivered (a failed version is skipped, not retried: one more is published in
    // its place) or the coordinator ends the job.
    std::uint64_t version = 0;
    for (std::uint32_t delivered = 0; !failure && !interrupted && delivered < job.versions;) {
      version = std::max(version + 1, trainer.next_version());
      for (std::size_t i = 0; i < tensors.size(); ++i) fill_version(storage[i].span(), tensors[i].spec.name, version);
      if (on_gpu) {
        (void)select_device(f.device);
        for (std::size_t i = 0; i < tensors.size() && !failure; ++i) {
          if (auto ec = copy_blocking(tensors[i].data, storage[i].data(), tensors[i].spec.nbytes))
            failure = "upload of '" + tensors[i].spec.name + "' failed: " + ec.message();
        }
        if (failure) break;
      }
      ferry::trainer::update update(nullptr);
      if (auto s = trainer.publish(version, &update); !s) {
        if (s.code != ferry::api_errc::closed) failure = "publish refused: " + s.message;
        break;
      }
      const auto s = await([&](auto slice) { return update.wait_delivered(slice); });
      if (!s || s->code == ferry::api_errc::closed) break;  // interrupted, timed out, or the job ended
      if (s->code == ferry::api_errc::update_failed) {
        const auto prefix = fmt::format("version {}: ", version);  // the API's message names the version
        const auto reason = s->message.starts_with(prefix) ? s->message.substr(prefix.size()) : s->message;
        log::warn("trainer shard {}: version {} failed: {}; publishing again once the job regroups", f.shard, version, reason);
        continue;  // `publish` waits for the regrouped job
      }
      if (!*s) failure = s->message;
      else ++delivered;
    }
    if (!failure && !interrupted) until_the_end(trainer);
    if (interrupted) trainer.close(interrupt_name());
  } else {
    // A replacement (a rank past the instance size) holds the share of rank % size.
    auto destinations = rollout_share(model, job.shard_rollout, f.rank % job.workers_per_instance, job.workers_per_instance);
    std::string why;
    if (on_gpu && (destinations = on_gpu->allocate(destinations, why)).empty())
      return std::fprintf(stderr, "ferry node: %s\n", why.c_str()), 1;
    ferry::rollout rollout({member, f.instance, f.rank});
    for (const auto& t : destinations) {
      if (auto s = register_share(rollout, t); !s) return std::fprintf(stderr, "ferry node: %s\n", s.message.c_str()), 2;
    }
    rollout.on_version([&](std::uint64_t v) { log::debug("worker {}.{}: version {} applied", f.instance, f.rank, v); });
    if (auto usage = joined(rollout.join())) return *usage;
    if (!failure) until_the_end(rollout);
    if (interrupted) rollout.close(interrupt_name());
    if (on_gpu && !failure && !interrupted) {
      // Every byte of the last version on this GPU, against what the trainers published.
      if (rollout.version() != job.versions) {
        failure = fmt::format("holds version {} of {} at the end", rollout.version(), job.versions);
      } else if (auto error = check_device_tensors(destinations, rollout.version()); !error.empty()) {
        failure = "GPU bytes differ: " + error;
      } else {
        std::uint64_t bytes = 0;
        for (const auto& t : destinations) bytes += t.held().bytes;
        log::info("worker {}.{}: every byte of version {} verified on GPU {} ({} bytes)", f.instance, f.rank,
                  rollout.version(), f.device, bytes);
      }
    }
  }
  if (interrupted) return interrupted_exit_code();  // the member left as it closed
  if (failure) log::error("node {}: {}", f.id, *failure);
  log::set_level(log::level::error);  // peers leaving after the job's end is the plan, not news
  return failure ? 1 : 0;
}

}  // namespace

int run_local(const process_flags& f) {
  if (auto error = check_job_options(f.job); !error.empty()) return std::fprintf(stderr, "ferry local: %s\n", error.c_str()), 2;
  const auto gpu_nodes = (f.host_trainers ? 0 : f.job.trainers) + f.job.instances * f.job.workers_per_instance;
  if (f.gpus && static_cast<int>(gpu_nodes) > visible_gpus()) {
    return std::fprintf(stderr, "ferry local: --gpus needs one GPU per node: %u GPU nodes, %d GPUs visible\n",
                        gpu_nodes, visible_gpus()),
           2;
  }
  if (f.job.transport == "inproc") return std::fprintf(stderr, "ferry local: --transport must be tcp, cma or fabric\n"), 2;
  const auto self = std::filesystem::read_symlink("/proc/self/exe").string();
  const auto dir = make_job_directory("local");
  const auto address_file = (dir / "coordinator").string();

  auto extra = [&](std::vector<std::string> args) { return with_process_flags(f, std::move(args)); };
  std::vector<std::filesystem::path> traces;  // one per process, merged into --trace at the end
  auto traced = [&](std::vector<std::string>& args) {
    if (f.job.trace_path.empty()) return;
    traces.push_back(dir / fmt::format("trace.{}.json", traces.size()));
    args.insert(args.end(), {"--trace", traces.back().string()});
  };
  auto coordinator_args = extra(job_args(self, "coordinator", f.job));
  coordinator_args.insert(coordinator_args.end(), {"--address-file", address_file});
  traced(coordinator_args);
  if (f.gpus) coordinator_args.insert(coordinator_args.end(), {"--heartbeat-timeout", "30"});
  if (f.json) coordinator_args.push_back("--json");
  const pid_t coordinator_pid = spawn(coordinator_args);
  const auto address = coordinator_pid > 0 ? wait_for_address(address_file, std::chrono::seconds(30)) : "";
  std::vector<pid_t> children;
  int status = 1;
  if (interrupt_signal()) {
    // Stopped before the job began: the coordinator alone gets the signal.
    reap({coordinator_pid}, interrupted_grace);
    std::filesystem::remove_all(dir);
    return interrupted_exit_code();
  }
  if (!address.empty()) {
    node_id next = 1;
    int next_gpu = 0;
    auto start_node = [&](std::vector<std::string> role) {
      auto args = extra(job_args(self, "node", f.job));
      const bool on_gpu = f.gpus && !(f.host_trainers && role.at(1) == "trainer");
      if (on_gpu) args.insert(args.end(), {"--device", std::to_string(next_gpu++)});
      args.insert(args.end(), {"--coordinator", address, "--node-id", std::to_string(next++)});
      args.insert(args.end(), role.begin(), role.end());
      traced(args);
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
    while (waitpid(coordinator_pid, &raw, WNOHANG) == 0) {
      if (sleep_unless_interrupted(std::chrono::milliseconds(50))) continue;
      // SIGINT or SIGTERM: every process of the job gets it; the nodes leave, the coordinator
      // stops the job; none outlives the grace.
      children.insert(children.begin(), coordinator_pid);
      reap(children, interrupted_grace);
      std::filesystem::remove_all(dir);
      return interrupted_exit_code();
    }
    status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 1;
  } else {
    std::fprintf(stderr, "ferry local: the coordinator did not start\n");
    if (coordinator_pid > 0) kill(coordinator_pid, SIGKILL);
  }
  // Nodes leave on job_stop; give them a moment, then make sure none is left behind.
  // GPU nodes check every byte on their device after the job, which takes a while.
  // Every node must exit 0: a failure at a node's exit (a sanitizer report in a destructor)
  // aborts only that node, after the job was delivered.
  const auto ok = reap(children, std::chrono::seconds(f.gpus ? 180 : 10));
  if (interrupt_signal()) {
    std::filesystem::remove_all(dir);
    return interrupted_exit_code();
  }
  for (std::size_t i = 0; i < children.size(); ++i) {
    if (ok[i]) continue;
    log::error("local: node process {} failed (its byte check, its role or its exit)", children[i]);
    status = 1;
  }
  if (!traces.empty()) {
    if (auto ec = merge_traces(traces, f.job.trace_path)) {
      log::error("local: cannot write the trace to {}: {}", f.job.trace_path, ec.message());
      status = 1;
    }
  }
  std::filesystem::remove_all(dir);
  return status;
}

void add_process_flags(CLI::App& app, process_flags& f) {
  add_job_options(app, f.job);
  app.add_flag("--allow-unauthenticated", f.allow_unauthenticated,
               "run tcp and fabric links without a job secret (otherwise FERRY_SECRET or FERRY_SECRET_FILE is required)");
  app.add_option("--fabric-provider", f.fabric_provider, "libfabric provider for --transport fabric (e.g. shm, 'tcp;ofi_rxm')");
  app.add_option("--bind", f.bind_host, "the local address to listen and connect on (tcp, cma, fabric other than shm)")
      ->capture_default_str();
  app.add_option("--model", f.model, "synthetic (sized by --model-bytes) or llama3-8b (bf16, ~16 GB)")
      ->check(CLI::IsMember({"synthetic", "llama3-8b"}))->capture_default_str();
  app.add_option("--timeout", f.timeout_seconds, "give up after this many seconds")->check(CLI::PositiveNumber)
      ->capture_default_str();
}

std::vector<std::string> job_args(const std::string& self, const std::string& command, const job_config& j) {
  return {self, command, "--trainers", std::to_string(j.trainers), "--instances", std::to_string(j.instances),
          "--workers", std::to_string(j.workers_per_instance), "--model-bytes", std::to_string(j.model_bytes),
          "--chunk-bytes", std::to_string(j.chunk_bytes), "--depth", std::to_string(j.depth), "--stripes",
          std::to_string(j.stripes), "--versions", std::to_string(j.versions), "--transport", j.transport,
          "--shard-rollout", std::string(rollout_sharding_name(j.shard_rollout))};
}

/// `args` plus the flags every process of a launched job shares.
std::vector<std::string> with_process_flags(const process_flags& f, std::vector<std::string> args) {
  if (!f.job.checksums) args.push_back("--no-checksums");
  if (!f.job.verify) args.push_back("--no-verify");
  if (f.job.shared_host_copies) args.push_back("--shared-host-copies");
  args.insert(args.end(), {"--timeout", std::to_string(f.timeout_seconds)});
  if (!f.fabric_provider.empty()) args.insert(args.end(), {"--fabric-provider", f.fabric_provider});
  if (f.bind_host != "127.0.0.1") args.insert(args.end(), {"--bind", f.bind_host});
  if (f.model != "synthetic") args.insert(args.end(), {"--model", f.model});
  return args;
}

void add_jobs(CLI::App& app, command_table& commands) {
  auto* coord = app.add_subcommand("coordinator", "the coordinator of a multi-process job");
  auto cf = std::make_shared<process_flags>();
  cf->job.transport = "tcp";
  add_process_flags(*coord, *cf);
  coord->add_option("--address-file", cf->address_file, "write the coordinator's transport address here");
  coord->add_option("--heartbeat-timeout", cf->heartbeat_timeout_s, "seconds of silence after which a member is dead")
      ->check(CLI::PositiveNumber)->capture_default_str();
  coord->add_flag("--json", cf->json, "print one JSON object instead of the table");
  coord->add_flag("--events", cf->events, "print a JSON line per update, delivery and regroup");
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
  node_cmd->add_option("--device", nf->device, "the GPU of this process's tensors (CUDA builds); -1: host memory")
      ->capture_default_str();
  commands[node_cmd] = [nf] { return run_node(*nf); };

  auto* local = app.add_subcommand("local", "a whole job of separate processes on this host");
  auto lf = std::make_shared<process_flags>();
  lf->job.transport = "tcp";
  add_process_flags(*local, *lf);
  local->add_flag("--json", lf->json, "print one JSON object instead of the table");
  local->add_flag("--gpus", lf->gpus, "one GPU per node process: trainers on GPUs 0.., then the workers");
  local->add_flag("--host-trainers", lf->host_trainers, "with --gpus: trainer shards in host memory, workers from GPU 0");
  commands[local] = [lf] { return run_local(*lf); };
}

}  // namespace ferry::cli
