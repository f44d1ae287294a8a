/// Multi-process jobs: `ferry coordinator` and the `ferry local` launcher that starts a whole job
/// of separate processes on this host (`ferry node`, one member per process, is in node.cpp;
/// `ferry chaos`, which kills some of them, in chaos.cpp).
#include "cli/job.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "actors/coordinator.hpp"
#include "actors/synthetic_model.hpp"
#include "cli/commands.hpp"
#include "cli/gpu.hpp"
#include "cli/interrupt.hpp"
#include "cli/launch.hpp"
#include "cli/options.hpp"
#include "cli/report.hpp"
#include "jobs/job_memory.hpp"
#include "jobs/model_presets.hpp"
#include "platform/real_environment.hpp"
#include "protocol/protocol.hpp"
#include "runtime/log.hpp"
#include "runtime/node.hpp"
#include "transport/factory.hpp"
#include "transport/link_auth.hpp"

namespace ferry::cli {

std::optional<std::string> prepare_environment(const process_flags& f, transport_settings& env) {
  // Bad values fail here, at once, rather than as a refused plan after every node registered.
  if (auto error = check_job_options(f.job); !error.empty()) return error;
  if (f.job.transport == "inproc")
    return "--transport inproc cannot span processes; use tcp, cma or fabric";
  env.allow_unauthenticated = f.allow_unauthenticated;
  env.fabric_provider = f.fabric_provider;
  env.bind_host = f.bind_host;
  if (f.job.transport != "inproc" && !f.allow_unauthenticated) {
    auto secret = load_job_secret();
    if (!secret) {
      // Name where the secret was looked for, never its bytes.
      const char* file = std::getenv("FERRY_SECRET_FILE");
      const std::string source =
          file && *file ? fmt::format("FERRY_SECRET_FILE '{}'", file) : "FERRY_SECRET";
      const bool short_secret = secret.error() == errc::invalid_argument;
      return fmt::format(
          "{}: {}", source,
          short_secret ? fmt::format("the job secret must be at least {} bytes", min_secret_bytes)
                       : secret.error().message());
    }
    if (secret->empty())
      return "no job secret: set FERRY_SECRET_FILE (or FERRY_SECRET), or pass "
             "--allow-unauthenticated";
    env.secret = *secret;
  }
  return std::nullopt;
}

namespace {

/// A regroup's causes in the coordinator's events: [{"kind": "worker_joined", "node": 7}, ...].
nlohmann::json causes_json(const std::vector<regroup_cause>& causes) {
  auto out = nlohmann::json::array();
  for (const auto& c : causes) {
    nlohmann::json one{{"kind", regroup_cause_name(c.what)}};
    if (c.node) one["node"] = *c.node;
    out.push_back(std::move(one));
  }
  return out;
}

/// Runs the loop until `done` or the timeout; false on timeout.
bool run_with_timeout(event_loop& loop, const process_flags& f, const std::function<bool()>& done) {
  bool expired = false;
  real_clock clock(loop.io());
  const auto timer = clock.async_wait(
      std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(f.timeout_seconds)),
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
    if (auto ec = env_.trace().write_chrome(path_))
      log::error("cannot write the trace to {}: {}", path_, ec.message());
  }

 private:
  environment& env_;
  std::string path_;
};

/// What the coordinator of `ferry coordinator` reports, gathered for its summary.
struct coordinator_run {
  job_result result;
  std::optional<std::string> failure;
  std::vector<double> regroup_ms;
};

/// The coordinator's reports into `run`, logged, and with --events one JSON line each on stdout
/// (for `ferry chaos`).
void watch(job_coordinator& coord, const process_flags& f, coordinator_run& run) {
  coord.on_ready = [&run](const plan& p) {
    run.result.model_bytes = p.total_bytes();
    run.result.tensors = p.tensors.size();
    run.result.chunks = p.chunks.size();
    const auto share = p.receive_shares();
    run.result.worker_bytes = share.most_bytes;
    run.result.receive_ratio = share.worst_ratio;
    run.result.paths = p.paths();
    log::info("coordinator: every leader is ready; updates may start");
  };
  coord.on_failed = [&run](const std::string& why) { run.failure = why; };
  auto event = [&f](nlohmann::json e) {
    if (!f.events) return;
    std::printf("%s\n", e.dump().c_str());
    std::fflush(stdout);
  };
  coord.on_delivered = [&f, &run, event](const version_report& r) {
    run.result.versions.push_back(r);
    log::info(
        "version {}/{}: {:.2f} GB to {} workers in {:.3f} s ({:.2f} GB/s), trainer stalled {:.3f} "
        "s{}",
        r.version, f.job.versions, r.bytes / 1e9, r.workers, r.seconds, r.bytes / r.seconds / 1e9,
        r.offloaded_seconds, r.verified ? ", digests match" : "");
    event({{"event", "delivered"},
           {"version", r.version},
           {"seconds", r.seconds},
           {"verified", r.verified}});
  };
  coord.on_update = [event](std::uint64_t version, bool catch_up,
                            const std::vector<node_id>& leaders) {
    event(
        {{"event", "update"}, {"version", version}, {"catch_up", catch_up}, {"leaders", leaders}});
  };
  coord.on_regroup = [&run, event](const regroup_report& r) {
    run.regroup_ms.push_back(r.milliseconds);
    event({{"event", "regroup"},
           {"epoch", r.epoch},
           {"ms", r.milliseconds},
           {"reason", r.reason()},
           {"causes", causes_json(r.causes)},
           {"leaders_lost_mid_update", r.leaders_lost_mid_update},
           {"leaders", r.leaders}});
  };
  coord.on_update_failed = [event](std::uint64_t version, const std::string& why) {
    event({{"event", "update_failed"}, {"version", version}, {"reason", why}});
  };
}

/// The summary (JSON or a table) and the exit code, once the loop is done.
int finish(const process_flags& f, const job_coordinator& coord, coordinator_run& run,
           bool interrupted, bool finished) {
  log::set_level(log::level::error);  // from here on, peers leaving is the plan, not news
  if (interrupted && !run.failure) {
    run.failure = fmt::format("stopped by {} with {} of {} versions delivered", interrupt_name(),
                              run.result.versions.size(), f.job.versions);
  }
  if (!finished)
    run.failure = fmt::format("timed out after {} s with {} of {} versions delivered",
                              f.timeout_seconds, run.result.versions.size(), f.job.versions);
  run.result.ok = !run.failure;
  run.result.verified = run.result.ok && f.job.verify;
  for (const auto& v : run.result.versions) run.result.verified = run.result.verified && v.verified;
  run.result.verified = run.result.verified && coord.digest_mismatches() == 0;
  if (run.failure) run.result.error = *run.failure;
  auto summary = summary_json(run.result);
  std::sort(run.regroup_ms.begin(), run.regroup_ms.end());
  summary["regroups"] = coord.regroups();
  summary["regroup_ms_median"] =
      run.regroup_ms.empty() ? 0.0 : run.regroup_ms[run.regroup_ms.size() / 2];
  summary["regroup_ms_max"] = run.regroup_ms.empty() ? 0.0 : run.regroup_ms.back();
  std::printf("%s", f.json ? (summary.dump() + "\n").c_str() : summary_table(run.result).c_str());
  std::fflush(stdout);
  if (interrupted) return interrupted_exit_code();
  return run.result.ok && (run.result.verified || !f.job.verify) ? 0 : 1;
}

int run_coordinator(const process_flags& f) {
  transport_settings env;
  if (auto error = prepare_environment(f, env))
    return std::fprintf(stderr, "ferry coordinator: %s\n", error->c_str()), 2;
  event_loop loop;
  real_environment environment(loop);
  const trace_on_exit trace(environment, f.job.trace_path);
  // SIGINT or SIGTERM: the job stops (its nodes are told), and so does this process.
  bool interrupted = false;
  std::stop_callback on_interrupt(interrupt_token(),
                                  [&] { loop.post([&] { interrupted = true; }); });
  auto t = make_transport(f.job.transport, environment, coordinator_node, env);
  if (!t)
    return std::fprintf(stderr, "ferry coordinator: cannot open the transport: %s\n",
                        t.error().message().c_str()),
           1;
  node host(environment, coordinator_node, *t, protocol());
  if (auto ec = host.start())
    return std::fprintf(stderr, "ferry coordinator: %s\n", ec.message().c_str()), 1;

  job_shape shape{
      .trainers = f.job.trainers,
      .instance_sizes = std::vector<std::uint32_t>(f.job.instances, f.job.workers_per_instance),
      .chunk_bytes = f.job.chunk_bytes,
      .depth = f.job.depth,
      .stripes = f.job.stripes,
      .shared_host_copies = f.job.shared_host_copies,
      .p2p = f.job.p2p};
  // GPU nodes pin tens of GiB on their loop thread at plan time: give their heartbeats room.
  shape.heartbeat_timeout =
      std::chrono::milliseconds(static_cast<long>(f.heartbeat_timeout_s * 1000));
  job_coordinator coord(host, job_actor, shape);
  coordinator_run run;
  run.result.workers = f.job.instances * f.job.workers_per_instance;
  watch(coord, f, run);
  coord.start();

  const std::string address = host.transport().local_address();
  if (!f.address_file.empty()) {
    const auto tmp = f.address_file + ".tmp";
    std::ofstream(tmp) << address << "\n";
    std::filesystem::rename(tmp, f.address_file);
  }
  log::info("coordinator: listening at {}", address);

  // Done when enough versions are delivered and no late joiner is still catching up.
  const bool finished = run_with_timeout(loop, f, [&] {
    return interrupted || run.failure ||
           (run.result.versions.size() >= f.job.versions && coord.idle());
  });
  coord.stop_job();
  run_with_timeout(loop, {.timeout_seconds = 0.2}, [] { return false; });  // let job_stop leave
  return finish(f, coord, run, interrupted, finished);
}

/// The GPU of each GPU node of a local job, in start order (`--gpu-list`, or one each from GPU 0
/// with `--gpus`), or what is wrong.
std::optional<std::string> place_on_gpus(const process_flags& f, std::vector<int>& devices) {
  const auto gpu_nodes =
      (f.host_trainers ? 0 : f.job.trainers) + f.job.instances * f.job.workers_per_instance;
  const int visible = visible_gpus();
  if (!f.gpu_list.empty()) {
    if (f.gpu_list.size() != gpu_nodes)
      return fmt::format("--gpu-list names {} GPUs for {} GPU nodes", f.gpu_list.size(), gpu_nodes);
    devices = f.gpu_list;
    // NCCL takes one rank per GPU: an instance whose members share chunks cannot put two on one.
    const auto first_worker = devices.begin() + (f.host_trainers ? 0 : f.job.trainers);
    for (std::uint32_t i = 0; f.job.shard_rollout != rollout_sharding::tp && i < f.job.instances;
         ++i) {
      std::vector<int> gpus(first_worker + i * f.job.workers_per_instance,
                            first_worker + (i + 1) * f.job.workers_per_instance);
      std::sort(gpus.begin(), gpus.end());
      if (const auto twice = std::adjacent_find(gpus.begin(), gpus.end()); twice != gpus.end())
        return fmt::format(
            "--gpu-list: instance {} has two workers on GPU {}, and its collective (NCCL) takes "
            "one "
            "rank per GPU (only --shard-rollout tp shares no chunk inside an instance)",
            i, *twice);
    }
    for (const int d : f.gpu_list)
      if (d < 0 || d >= visible)
        return fmt::format("--gpu-list: GPU {}: {} GPUs visible", d, visible);
  } else if (f.gpus) {
    if (static_cast<int>(gpu_nodes) > visible)
      return fmt::format(
          "--gpus needs one GPU per node: {} GPU nodes, {} GPUs visible (--gpu-list shares them)",
          gpu_nodes, visible);
    for (int d = 0; d < static_cast<int>(gpu_nodes); ++d) devices.push_back(d);
  }
  return std::nullopt;
}

}  // namespace

int run_local(const process_flags& f) {
  if (auto error = check_job_options(f.job); !error.empty())
    return std::fprintf(stderr, "ferry local: %s\n", error.c_str()), 2;
  std::vector<int> devices;  // of the GPU nodes, in start order
  if (auto error = place_on_gpus(f, devices))
    return std::fprintf(stderr, "ferry local: %s\n", error->c_str()), 2;
  const bool gpus = !devices.empty();
  if (f.job.transport == "inproc")
    return std::fprintf(stderr, "ferry local: --transport must be tcp, cma or fabric\n"), 2;
  const auto model =
      f.model == "llama3-8b" ? llama3_8b() : synthetic_transformer(f.job.model_bytes);
  const member_places places{.trainers_on_gpus = gpus && !f.host_trainers, .workers_on_gpus = gpus};
  if (auto error = refuse_beyond_host(model, f.job, places))
    return std::fprintf(stderr, "ferry local: %s\n", error->c_str()), 2;
  const auto self = std::filesystem::read_symlink("/proc/self/exe").string();
  const auto dir = make_job_directory("local");
  const auto address_file = (dir / "coordinator").string();

  auto extra = [&](std::vector<std::string> args) {
    return with_process_flags(f, std::move(args));
  };
  std::vector<std::filesystem::path> traces;  // one per process, merged into --trace at the end
  auto traced = [&](std::vector<std::string>& args) {
    if (f.job.trace_path.empty()) return;
    traces.push_back(dir / fmt::format("trace.{}.json", traces.size()));
    args.insert(args.end(), {"--trace", traces.back().string()});
  };
  auto coordinator_args = extra(job_args(self, "coordinator", f.job));
  coordinator_args.insert(coordinator_args.end(), {"--address-file", address_file});
  traced(coordinator_args);
  if (gpus) coordinator_args.insert(coordinator_args.end(), {"--heartbeat-timeout", "30"});
  if (f.json) coordinator_args.push_back("--json");
  const pid_t coordinator_pid = spawn(coordinator_args);
  const auto address =
      coordinator_pid > 0 ? wait_for_address(address_file, std::chrono::seconds(30)) : "";
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
    std::size_t next_gpu = 0;
    auto start_node = [&](std::vector<std::string> role) {
      auto args = extra(job_args(self, "node", f.job));
      const bool on_gpu = gpus && !(f.host_trainers && role.at(1) == "trainer");
      if (on_gpu) args.insert(args.end(), {"--device", std::to_string(devices.at(next_gpu++))});
      args.insert(args.end(), {"--coordinator", address, "--node-id", std::to_string(next++)});
      args.insert(args.end(), role.begin(), role.end());
      traced(args);
      children.push_back(spawn(args));
    };
    for (std::uint32_t s = 0; s < f.job.trainers; ++s)
      start_node({"--role", "trainer", "--shard", std::to_string(s)});
    for (std::uint32_t i = 0; i < f.job.instances; ++i) {
      for (std::uint32_t r = 0; r < f.job.workers_per_instance; ++r) {
        start_node(
            {"--role", "worker", "--instance", std::to_string(i), "--rank", std::to_string(r)});
      }
    }
    log::info("local: started a coordinator and {} nodes", children.size());
    int raw = 0;
    while (reap_child(coordinator_pid, raw, WNOHANG) == 0) {
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
  const auto ok = reap(children, std::chrono::seconds(gpus ? 180 : 10));
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
               "run tcp and fabric links without a job secret (otherwise FERRY_SECRET or "
               "FERRY_SECRET_FILE is required)");
  app.add_option("--fabric-provider", f.fabric_provider,
                 "libfabric provider for --transport fabric (e.g. shm, 'tcp;ofi_rxm')");
  app.add_option("--bind", f.bind_host,
                 "the local address to listen and connect on (tcp, cma, fabric other than shm)")
      ->capture_default_str();
  app.add_option("--model", f.model,
                 "synthetic (sized by --model-bytes) or llama3-8b (bf16, ~16 GB)")
      ->check(CLI::IsMember({"synthetic", "llama3-8b"}))
      ->capture_default_str();
  app.add_option("--timeout", f.timeout_seconds, "give up after this many seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

std::vector<std::string> job_args(const std::string& self, const std::string& command,
                                  const job_config& j) {
  return {self,
          command,
          "--trainers",
          std::to_string(j.trainers),
          "--instances",
          std::to_string(j.instances),
          "--workers",
          std::to_string(j.workers_per_instance),
          "--model-bytes",
          std::to_string(j.model_bytes),
          "--chunk-bytes",
          std::to_string(j.chunk_bytes),
          "--depth",
          std::to_string(j.depth),
          "--stripes",
          std::to_string(j.stripes),
          "--versions",
          std::to_string(j.versions),
          "--transport",
          j.transport,
          "--shard-rollout",
          std::string(rollout_sharding_name(j.shard_rollout))};
}

/// `args` plus the flags every process of a launched job shares.
std::vector<std::string> with_process_flags(const process_flags& f, std::vector<std::string> args) {
  if (!f.job.checksums) args.push_back("--no-checksums");
  if (!f.job.verify) args.push_back("--no-verify");
  if (f.job.shared_host_copies) args.push_back("--shared-host-copies");
  if (f.job.p2p != p2p_mode::automatic)
    args.insert(args.end(), {"--p2p", std::string(p2p_mode_name(f.job.p2p))});
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
  coord->add_option("--address-file", cf->address_file,
                    "write the coordinator's transport address here");
  coord
      ->add_option("--heartbeat-timeout", cf->heartbeat_timeout_s,
                   "seconds of silence after which a member is dead")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  coord->add_flag("--json", cf->json, "print one JSON object instead of the table");
  coord->add_flag("--events", cf->events, "print a JSON line per update, delivery and regroup");
  commands[coord] = [cf] { return run_coordinator(*cf); };

  auto* node_cmd =
      app.add_subcommand("node", "one trainer shard or rollout worker of a multi-process job");
  auto nf = std::make_shared<node_flags>();
  nf->common.job.transport = "tcp";
  add_process_flags(*node_cmd, nf->common);
  node_cmd
      ->add_option("--coordinator", nf->common.coordinator_address,
                   "the coordinator's transport address")
      ->required();
  node_cmd->add_option("--role", nf->role, "trainer or worker")
      ->required()
      ->check(CLI::IsMember({"trainer", "worker"}));
  node_cmd
      ->add_option("--node-id", nf->id, "this node's id, unique in the job (0 is the coordinator)")
      ->required()
      ->check(CLI::Range(1u, 1u << 30));
  node_cmd->add_option("--shard", nf->shard, "trainer: the shard this process owns");
  node_cmd->add_option("--instance", nf->instance, "worker: its instance");
  node_cmd->add_option("--rank", nf->rank, "worker: its rank in the instance");
  node_cmd
      ->add_option("--device", nf->device,
                   "the GPU of this process's tensors (CUDA builds); -1: host memory")
      ->capture_default_str();
  commands[node_cmd] = [nf] { return run_node(*nf); };

  auto* local = app.add_subcommand("local", "a whole job of separate processes on this host");
  auto lf = std::make_shared<process_flags>();
  lf->job.transport = "tcp";
  add_process_flags(*local, *lf);
  local->add_flag("--json", lf->json, "print one JSON object instead of the table");
  local->add_flag("--gpus", lf->gpus,
                  "one GPU per node process: trainers on GPUs 0.., then the workers");
  local->add_flag("--host-trainers", lf->host_trainers,
                  "with --gpus: trainer shards in host memory, workers from GPU 0");
  local
      ->add_option(
          "--gpu-list", lf->gpu_list,
          "the GPU of each GPU node process in start order (trainers, then workers), e.g. 0,0: "
          "several may share one; implies --gpus")
      ->delimiter(',');
  commands[local] = [lf] { return run_local(*lf); };
}

}  // namespace ferry::cli
