/// `ferry chaos`: a real multi-process job on loopback that publishes versions while rollout
/// processes are SIGKILLed at random moments (leaders among them, some mid-transfer) and
/// replacements join; with --instance-rate, whole instances also join and leave (elastic
/// rollout). It reads the coordinator's events to choose its moments, and its last line (with
/// --json) is the verdict.
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "actors/coordinator.hpp"
#include "cli/commands.hpp"
#include "cli/footprint.hpp"
#include "cli/interrupt.hpp"
#include "cli/job.hpp"
#include "cli/launch.hpp"
#include "cli/options.hpp"
#include "jobs/virtual_chaos.hpp"
#include "runtime/log.hpp"
#include "runtime/message.hpp"

namespace ferry::cli {
namespace {

struct chaos_flags {
  process_flags common;
  bool virtual_time = false;
  std::uint64_t seed = 1;
  double kill_rate = 0.5;
  double instance_rate = 0;    ///< chance per update that a new instance joins or one leaves
  double update_bound_s = 30;  ///< an update, or the job's silence, longer than this is a hang
  bool footprint = false;      ///< sample every process at a tenth of the versions and at the last
};

/// The tally of a run, and its verdict.
struct chaos_tally {
  std::uint32_t kills = 0, leader_kills = 0, leader_kills_mid_update = 0, joins = 0;
  std::uint32_t instance_joins = 0, instance_leaves = 0;
  double slowest_update_s = 0;
  std::string hang;   ///< why the run was given up, if it was
  std::string crash;  ///< the first node that died without being killed
};

/// `ferry chaos --virtual`: the whole job in this process on virtual time (jobs/virtual_chaos).
/// The job flags the user gave override the defaults of virtual_chaos_config.
int run_virtual_chaos(const chaos_flags& f, const CLI::App& app) {
  const auto& job = f.common.job;
  if (auto error = check_job_options(job); !error.empty())
    return std::fprintf(stderr, "ferry chaos: %s\n", error.c_str()), 2;
  virtual_chaos_config c{.seed = f.seed, .trace_path = job.trace_path};
  auto given = [&](const char* flag) { return app.get_option(flag)->count() > 0; };
  if (given("--versions")) c.versions = job.versions;
  if (given("--trainers")) c.trainers = job.trainers;
  if (given("--instances")) c.instances = job.instances;
  if (given("--workers")) c.workers_per_instance = job.workers_per_instance;
  if (given("--model-bytes")) c.model_bytes = job.model_bytes;
  if (given("--chunk-bytes")) c.chunk_bytes = job.chunk_bytes;
  if (given("--depth")) c.depth = job.depth;
  if (given("--stripes")) c.stripes = job.stripes;
  c.sharding = job.shard_rollout;
  if (given("--transport") && job.transport != "inproc") {
    return std::fprintf(stderr,
                        "ferry chaos: --virtual runs on the inproc transport (virtual time has no "
                        "sockets)\n"),
           2;
  }
  // Regroups and failed updates are the point here: counted, not logged (unless FERRY_LOG asks).
  if (!std::getenv("FERRY_LOG")) log::set_level(log::level::off);
  const auto r = run_virtual_chaos(c);
  nlohmann::json faults = nlohmann::json::object();
  for (const auto& [name, times] : r.faults) faults[name] = times;
  nlohmann::json out{{"verified", r.verified},
                     {"virtual", true},
                     {"seed", r.seed},
                     {"versions", r.delivered},
                     {"depth", r.depth},
                     {"stripes", r.stripes},
                     {"kills", r.kills},
                     {"leader_kills", r.leader_kills},
                     {"leader_kills_mid_update", r.leader_kills_mid_update},
                     {"trainer_kills", r.trainer_kills},
                     {"joins", r.joins},
                     {"regroups", r.regroups},
                     {"regroup_ms_median", r.regroup_ms_median},
                     {"regroup_ms_max", r.regroup_ms_max},
                     {"faults", faults},
                     {"trace_digest", fmt::format("{:016x}", r.trace_digest)},
                     {"trace_events", r.trace_events},
                     {"virtual_seconds", r.virtual_seconds},
                     {"wall_seconds", r.wall_seconds}};
  if (!r.verified) out["error"] = r.error;
  if (f.common.json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf(
        "chaos (virtual time, seed %llu, depth %u, stripes %u): %llu versions, %u kills (%u "
        "leaders, %u of them "
        "mid-update; %u trainers), %u joins, %u regroups: median %.3f ms, worst %.3f ms of virtual "
        "time; "
        "trace %016llx (%llu events); %.3f s virtual in %.2f s wall; %s\n",
        static_cast<unsigned long long>(r.seed), r.depth, r.stripes,
        static_cast<unsigned long long>(r.delivered), r.kills, r.leader_kills,
        r.leader_kills_mid_update, r.trainer_kills, r.joins, r.regroups, r.regroup_ms_median,
        r.regroup_ms_max, static_cast<unsigned long long>(r.trace_digest),
        static_cast<unsigned long long>(r.trace_events), r.virtual_seconds, r.wall_seconds,
        r.verified ? "verified" : "NOT verified");
    for (const auto& [name, times] : r.faults) std::printf("  %s: %u\n", name.c_str(), times);
    if (!r.verified) std::printf("chaos: %s\n", r.error.c_str());
  }
  return r.verified ? 0 : 1;
}

/// The multi-process run: the coordinator's events in, kills and joins out.
class process_chaos {
 public:
  explicit process_chaos(const chaos_flags& f)
      : f_(f),
        job_(f.common.job),
        self_(std::filesystem::read_symlink("/proc/self/exe").string()),
        dir_(make_job_directory("chaos")),
        rng_(f.seed) {}

  /// Starts the coordinator and every node; an exit code when that failed or was interrupted.
  std::optional<int> start();
  /// Follows the job until its verdict, killing and replacing workers along the way.
  void follow();
  /// SIGINT or SIGTERM ended `follow`.
  bool stopped() const { return events_->stopped(); }
  /// Then every process of the job gets it and a short time to act on it.
  int interrupted();
  /// Reaps the job and says how it went.
  nlohmann::json finish();
  const chaos_tally& tally() const { return tally_; }

 private:
  struct worker_process {
    pid_t pid;
    std::uint32_t instance, rank;
  };
  /// `args` with the flags every process takes, and `--trace` to a file of its own: each process
  /// writes its timeline as it exits, merged into one at the end (the killed ones write none).
  std::vector<std::string> with_common(std::vector<std::string> args);
  std::pair<node_id, pid_t> start_node(std::vector<std::string> role);
  node_id start_worker(std::uint32_t instance);
  /// A node that died without being killed here is a crash: the run fails, even if the job
  /// recovers.
  void check_for_crashes();
  /// Elastic rollout: a new instance of --workers joins, or (while two or more are left) every
  /// worker of one gets SIGTERM and leaves the job for good.
  void instance_event();
  /// One kill chance per version, at a random moment of its update, a leader half the time; a
  /// replacement joins at once.
  void chance(const nlohmann::json& update);
  std::vector<pid_t> every_node() const;

  const chaos_flags& f_;
  const job_config& job_;
  std::string self_;
  std::filesystem::path dir_;
  std::vector<std::filesystem::path> traces_;
  pid_t coordinator_pid_ = -1;
  std::optional<line_reader> events_;
  std::string address_;
  std::map<node_id, worker_process> workers_;
  std::set<node_id> joining_;  ///< replacements the coordinator has not reported as joined yet
  std::vector<pid_t> trainers_;
  std::map<pid_t, std::string> names_;  ///< every node process not killed on purpose
  std::map<std::uint32_t, std::uint32_t> next_rank_;
  node_id next_node_ = 1;
  std::uint32_t next_instance_ = 0;
  std::vector<pid_t> left_;  ///< workers of instances scaled away: reaped at the end
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> coin_{0, 1};
  chaos_tally tally_;
  footprint_log footprints_;
  std::set<std::uint64_t> chanced_;
  std::vector<node_id> leaders_;  ///< as the coordinator's last update or regroup named them
  nlohmann::json verdict_ =
      nlohmann::json::object();  ///< the coordinator's summary, when it gives one
};

std::vector<std::string> process_chaos::with_common(std::vector<std::string> args) {
  args = with_process_flags(f_.common, std::move(args));
  if (job_.trace_path.empty()) return args;
  traces_.push_back(dir_ / fmt::format("trace.{}.json", traces_.size()));
  args.insert(args.end(), {"--trace", traces_.back().string()});
  return args;
}

std::pair<node_id, pid_t> process_chaos::start_node(std::vector<std::string> role) {
  auto args = with_common(job_args(self_, "node", job_));
  args.insert(args.end(), {"--coordinator", address_, "--node-id", std::to_string(next_node_)});
  args.insert(args.end(), role.begin(), role.end());
  return std::pair{next_node_++, spawn(args)};
}

node_id process_chaos::start_worker(std::uint32_t instance) {
  const auto rank = next_rank_[instance]++;
  auto [id, pid] = start_node(
      {"--role", "worker", "--instance", std::to_string(instance), "--rank", std::to_string(rank)});
  workers_[id] = {pid, instance, rank};
  names_[pid] = fmt::format("worker {}.{} (node {})", instance, rank, id);
  return id;
}

std::optional<int> process_chaos::start() {
  const auto address_file = (dir_ / "coordinator").string();
  auto coordinator_args = with_common(job_args(self_, "coordinator", job_));
  coordinator_args.insert(coordinator_args.end(),
                          {"--address-file", address_file, "--events", "--json"});
  const auto [coordinator, events_fd] = spawn_reading(coordinator_args);
  coordinator_pid_ = coordinator;
  events_.emplace(events_fd, interrupt_fd());
  address_ = coordinator_pid_ > 0 ? wait_for_address(address_file, std::chrono::seconds(30)) : "";
  if (interrupt_signal()) {
    reap({coordinator_pid_}, interrupted_grace);
    std::filesystem::remove_all(dir_);
    return interrupted_exit_code();
  }
  if (address_.empty()) {
    std::fprintf(stderr, "ferry chaos: the coordinator did not start\n");
    if (coordinator_pid_ > 0) kill(coordinator_pid_, SIGKILL);
    std::filesystem::remove_all(dir_);
    return 1;
  }
  for (std::uint32_t s = 0; s < job_.trainers; ++s) {
    auto [id, pid] = start_node({"--role", "trainer", "--shard", std::to_string(s)});
    trainers_.push_back(pid);
    names_[pid] = fmt::format("trainer shard {} (node {})", s, id);
  }
  for (std::uint32_t i = 0; i < job_.instances; ++i) {
    for (std::uint32_t r = 0; r < job_.workers_per_instance; ++r) start_worker(i);
  }
  next_instance_ = job_.instances;
  return std::nullopt;
}

void process_chaos::check_for_crashes() {
  for (auto it = names_.begin(); it != names_.end(); ++it) {
    int raw = 0;
    if (reap_child(it->first, raw, WNOHANG) != it->first) continue;  // alive
    if (WIFEXITED(raw) && WEXITSTATUS(raw) == 0) continue;           // left after job_stop
    const auto how = WIFSIGNALED(raw) ? fmt::format("signal {}", WTERMSIG(raw))
                                      : fmt::format("exit {}", WEXITSTATUS(raw));
    if (tally_.crash.empty())
      tally_.crash = fmt::format("{} died without being killed ({})", it->second, how);
  }
}

void process_chaos::instance_event() {
  std::set<std::uint32_t> present;
  for (const auto& [id, w] : workers_) present.insert(w.instance);
  if (present.size() >= 2 && coin_(rng_) < 0.5) {
    const auto gone = *std::next(
        present.begin(), std::uniform_int_distribution<std::size_t>(0, present.size() - 1)(rng_));
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (it->second.instance != gone) {
        ++it;
        continue;
      }
      kill(it->second.pid, SIGTERM);
      names_.erase(it->second.pid);
      left_.push_back(it->second.pid);
      joining_.erase(it->first);
      it = workers_.erase(it);
    }
    log::info("chaos: instance {} leaves", gone);
    ++tally_.instance_leaves;
    return;
  }
  const auto instance = next_instance_++;
  for (std::uint32_t r = 0; r < job_.workers_per_instance; ++r)
    joining_.insert(start_worker(instance));
  log::info("chaos: instance {} joins ({} workers)", instance, job_.workers_per_instance);
  ++tally_.instance_joins;
}

void process_chaos::chance(const nlohmann::json& update) {
  // A regroup resends the same version: one chance per version, not per resend.
  if (!chanced_.insert(update.value("version", 0ull)).second) return;
  if (f_.instance_rate > 0 && coin_(rng_) < f_.instance_rate) instance_event();
  if (coin_(rng_) >= f_.kill_rate || workers_.empty()) return;
  node_id victim = 0;
  if (!leaders_.empty() && coin_(rng_) < 0.5) {
    victim = leaders_[std::uniform_int_distribution<std::size_t>(0, leaders_.size() - 1)(rng_)];
  } else {
    // Members only: a replacement killed before it joined leaves no trace in the job.
    std::vector<node_id> members;
    for (const auto& [id, w] : workers_) {
      if (!joining_.contains(id)) members.push_back(id);
    }
    if (members.empty()) return;
    victim = members[std::uniform_int_distribution<std::size_t>(0, members.size() - 1)(rng_)];
  }
  auto it = workers_.find(victim);
  if (it == workers_.end()) return;
  // A random moment in the first 30 ms of the update: most land mid-transfer.
  std::this_thread::sleep_for(
      std::chrono::microseconds(std::uniform_int_distribution<int>(0, 30000)(rng_)));
  kill(it->second.pid, SIGKILL);
  int raw = 0;
  reap_child(it->second.pid, raw, 0);
  names_.erase(it->second.pid);
  const bool was_leader = std::find(leaders_.begin(), leaders_.end(), victim) != leaders_.end();
  log::info("chaos: killed worker {}.{} (node {}{})", it->second.instance, it->second.rank, victim,
            was_leader ? ", a leader" : "");
  ++tally_.kills;
  tally_.leader_kills += was_leader;
  const auto instance = it->second.instance;
  workers_.erase(it);
  joining_.insert(start_worker(instance));
  ++tally_.joins;
}

void process_chaos::follow() {
  const auto bound = std::chrono::milliseconds(static_cast<long>(f_.update_bound_s * 1000));
  while (auto line = events_->next(bound)) {
    check_for_crashes();
    auto e = nlohmann::json::parse(*line, nullptr, false);
    if (e.is_discarded() || !e.is_object()) continue;
    if (e.contains("verified") && !e.contains("event")) {
      verdict_ = e;
      break;
    }
    const auto kind = e.value("event", "");
    if (kind == "delivered") {
      tally_.slowest_update_s = std::max(tally_.slowest_update_s, e.value("seconds", 0.0));
      const auto version = e.value("version", 0ull);
      if (f_.footprint &&
          (version == std::max<std::uint64_t>(job_.versions / 10, 1) || version == job_.versions)) {
        auto processes = names_;
        processes[coordinator_pid_] = "coordinator";
        footprints_.sample(processes);
      }
    }
    if (kind == "regroup") {
      tally_.leader_kills_mid_update += e.value("leaders_lost_mid_update", 0u);
      for (const auto& cause : e.value("causes", nlohmann::json::array())) {
        if (cause.value("kind", "") == regroup_cause_name(regroup_cause::kind::worker_joined))
          joining_.erase(cause.value("node", node_id{}));
      }
    }
    if (kind == "regroup" || kind == "update")
      leaders_ = e.value("leaders", std::vector<node_id>{});
    if (kind == "update" && !e.value("catch_up", false) && e.value("version", 0ull) < job_.versions)
      chance(e);
  }
}

std::vector<pid_t> process_chaos::every_node() const {
  std::vector<pid_t> nodes = trainers_;
  for (const auto& [id, w] : workers_) nodes.push_back(w.pid);
  nodes.insert(nodes.end(), left_.begin(), left_.end());
  return nodes;
}

int process_chaos::interrupted() {
  std::vector<pid_t> everyone{coordinator_pid_};
  for (const auto pid : every_node()) everyone.push_back(pid);
  reap(everyone, interrupted_grace);
  std::filesystem::remove_all(dir_);
  std::fprintf(stderr, "ferry chaos: stopped by %s after %u kills\n", interrupt_name(),
               tally_.kills);
  return interrupted_exit_code();
}

nlohmann::json process_chaos::finish() {
  if (events_->timed_out()) {
    tally_.hang =
        fmt::format("no progress for {} s (--update-bound): the job hung", f_.update_bound_s);
    kill(coordinator_pid_, SIGKILL);
  } else if (tally_.slowest_update_s > f_.update_bound_s) {
    tally_.hang = fmt::format("an update took {:.1f} s, over the bound of {} s",
                              tally_.slowest_update_s, f_.update_bound_s);
  }
  if (verdict_.is_null()) check_for_crashes();  // the coordinator's own exit is reaped below
  const bool coordinator_ok = reap({coordinator_pid_}, std::chrono::seconds(10)).front();
  reap(every_node(), std::chrono::seconds(10));
  std::string trace_error;
  if (!traces_.empty()) {
    if (auto ec = merge_traces(traces_, job_.trace_path))
      trace_error = fmt::format("cannot write the trace to {}: {}", job_.trace_path, ec.message());
  }
  std::filesystem::remove_all(dir_);

  const bool verified = coordinator_ok && tally_.hang.empty() && tally_.crash.empty() &&
                        verdict_.value("verified", false);
  nlohmann::json out{{"verified", verified},
                     {"versions", verdict_.value("versions", 0)},
                     {"kills", tally_.kills},
                     {"leader_kills", tally_.leader_kills},
                     {"leader_kills_mid_update", tally_.leader_kills_mid_update},
                     {"joins", tally_.joins},
                     {"instance_joins", tally_.instance_joins},
                     {"instance_leaves", tally_.instance_leaves},
                     {"regroups", verdict_.value("regroups", 0)},
                     {"regroup_ms_median", verdict_.value("regroup_ms_median", 0.0)},
                     {"regroup_ms_max", verdict_.value("regroup_ms_max", 0.0)},
                     {"update_seconds_max", tally_.slowest_update_s},
                     {"update_bound_seconds", f_.update_bound_s},
                     {"seed", f_.seed}};
  if (footprints_.complete()) out["footprint"] = footprints_.to_json();
  if (!tally_.crash.empty()) {
    out["error"] = tally_.crash;
  } else if (!tally_.hang.empty()) {
    out["error"] = tally_.hang;
  } else if (!verdict_.contains("verified")) {
    out["error"] = "the coordinator ended without its verdict";
  } else if (verdict_.contains("error")) {
    out["error"] = verdict_["error"].is_string() ? verdict_["error"].get<std::string>()
                                                 : verdict_["error"].dump();
  } else if (!trace_error.empty()) {
    out["error"] = trace_error;
  }
  return out;
}

int run_chaos(const chaos_flags& f) {
  const auto& job = f.common.job;
  if (auto error = check_job_options(job); !error.empty())
    return std::fprintf(stderr, "ferry chaos: %s\n", error.c_str()), 2;
  if (job.transport == "inproc")
    return std::fprintf(stderr, "ferry chaos: --transport must be tcp, cma or fabric\n"), 2;
  process_chaos run(f);
  if (auto failed = run.start()) return *failed;
  run.follow();
  if (run.stopped()) return run.interrupted();
  const auto out = run.finish();
  const bool verified = out["verified"].get<bool>();
  if (f.common.json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    const auto& t = run.tally();
    std::printf(
        "chaos: %s versions, %u kills (%u leaders), %u leaders lost mid-update, %u joins, %u "
        "instances "
        "joined and %u left, %d regroups: median %.1f ms, worst %.1f ms; slowest update %.3f s "
        "(bound %.0f s); "
        "%s\n",
        out["versions"].dump().c_str(), t.kills, t.leader_kills, t.leader_kills_mid_update, t.joins,
        t.instance_joins, t.instance_leaves, out["regroups"].get<int>(),
        out["regroup_ms_median"].get<double>(), out["regroup_ms_max"].get<double>(),
        t.slowest_update_s, f.update_bound_s, verified ? "verified" : "NOT verified");
    if (out.contains("error")) std::printf("chaos: %s\n", out["error"].get<std::string>().c_str());
  }
  return verified ? 0 : 1;
}

}  // namespace

void add_chaos(CLI::App& app, command_table& commands) {
  auto* chaos = app.add_subcommand(
      "chaos", "a multi-process job whose rollout processes are killed and replaced");
  auto xf = std::make_shared<chaos_flags>();
  xf->common.job = {.trainers = 2,
                    .instances = 2,
                    .workers_per_instance = 3,
                    .model_bytes = 64ull << 20,
                    .chunk_bytes = 2ull << 20,
                    .depth = 2,
                    .versions = 20,
                    .transport = "tcp"};
  add_process_flags(*chaos, xf->common);
  chaos->add_option("--seed", xf->seed, "seed of the kill schedule")->capture_default_str();
  chaos->add_option("--kill-rate", xf->kill_rate, "chance of a kill per update")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  chaos
      ->add_option(
          "--update-bound", xf->update_bound_s,
          "seconds an update (or the job's silence) may last before the run counts as hung")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  chaos
      ->add_option("--instance-rate", xf->instance_rate,
                   "chance per update that a new instance of --workers joins or (two or more left) "
                   "one leaves")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  chaos->add_flag("--json", xf->common.json, "print the verdict as one JSON object");
  chaos->add_flag("--footprint", xf->footprint,
                  "each process's resident memory and open files when a tenth of the versions are "
                  "delivered and "
                  "when the last is (JSON: footprint)");
  chaos->add_flag(
      "--virtual", xf->virtual_time,
      "the whole job in this process on virtual time, faults at seeded moments (deterministic)");
  commands[chaos] = [xf, chaos] {
    return xf->virtual_time ? run_virtual_chaos(*xf, *chaos) : run_chaos(*xf);
  };
}

}  // namespace ferry::cli
