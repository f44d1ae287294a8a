/// `ferry sim SCENARIO.toml`: a whole cluster's weight update on virtual time (jobs/sim_job), its
/// report, and sweeps of ferry's options written as CSV and a plot.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <thread>

#include "cli/commands.hpp"
#include "cli/interrupt.hpp"
#include "cli/launch.hpp"
#include "jobs/sim_scenario.hpp"
#include "runtime/log.hpp"

namespace ferry::cli {
namespace {

struct sim_flags {
  std::string scenario;
  bool json = false;
  std::string trace_path;
  std::vector<std::string> sets;
  std::vector<std::string> sweep;
  std::string csv = "sweep.csv";
  std::string plot = "sweep.png";
  unsigned jobs = 0;  ///< a sweep's runs at once; 0: one per core
};

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;
}

/// Chunk-stage events (the timeline's records) per second of wall time.
double events_per_second(const sim_result& r) {
  return r.wall_seconds > 0 ? r.trace_events / r.wall_seconds : 0;
}

/// The same from the first version's delivery to the last's, the set-up left out.
double steady_events_per_second(const sim_result& r) {
  return r.steady_wall_seconds > 0 ? r.steady_events / r.steady_wall_seconds : 0;
}

double gib(std::uint64_t bytes) {
  return static_cast<double>(bytes) / (1ull << 30);
}

/// Per role, the most one member holds in host and device memory.
nlohmann::json memory_json(const job_memory& m) {
  const auto of = [](const member_memory& x) {
    return nlohmann::json{{"host", gib(x.host)}, {"device", gib(x.device)}};
  };
  return {{"trainer", of(m.trainer)}, {"leader", of(m.leader)}, {"follower", of(m.follower)}};
}

nlohmann::json to_json(const sim_result& r) {
  nlohmann::json resources = nlohmann::json::array();
  for (const auto& u : r.resources) {
    if (resources.size() == 20) break;
    resources.push_back({{"name", u.name},
                         {"busy_seconds", u.busy_seconds},
                         {"utilisation", u.utilisation},
                         {"bytes", u.bytes},
                         {"bound_seconds", u.bound_seconds}});
  }
  return {{"delivered", r.delivered},
          {"error", r.error},
          {"predicted_seconds", r.predicted_seconds},
          {"stall_seconds", r.stall},
          {"bound_seconds", r.bound_seconds},
          {"bottleneck", r.bottleneck},
          {"update_seconds", r.update_seconds},
          {"stall_seconds_per_version", r.stall_seconds},
          {"stage_busy_seconds",
           {{"offload", r.stage_busy.offload},
            {"send", r.stage_busy.send},
            {"upload", r.stage_busy.upload},
            {"broadcast", r.stage_busy.broadcast},
            {"apply", r.stage_busy.apply}}},
          {"resources", resources},
          {"memory_gib", memory_json(r.memory)},
          {"memory_short", r.memory_short},
          {"wall_seconds", r.wall_seconds},
          {"actors", r.actors},
          {"transfers", r.transfers},
          {"chunk_stage_events", r.trace_events},
          {"events_per_second", events_per_second(r)},
          {"steady_events", r.steady_events},
          {"steady_wall_seconds", r.steady_wall_seconds},
          {"steady_events_per_second", steady_events_per_second(r)},
          {"peak_rss_mib", peak_rss_mib()},
          {"kills", r.kills},
          {"regroups", r.regroups},
          {"virtual_seconds", r.virtual_seconds}};
}

void print_report(const sim_config& c, const sim_result& r) {
  std::uint64_t bytes = 0;
  for (const auto& t : c.model) bytes += t.nbytes;
  fmt::print(
      "model {:.2f} GB ({} tensors), {} trainer shards -> {} instance(s) of {}, chunk {} MiB, "
      "depth {}, stripes {}, p2p {}\n",
      bytes / 1e9, c.model.size(), c.trainers, c.instances, c.instance_size, c.chunk_bytes >> 20,
      c.depth, c.stripes, p2p_mode_name(c.p2p));
  for (std::size_t v = 0; v < r.update_seconds.size(); ++v)
    fmt::print("version {}: update {:.4f} s, trainer stall {:.4f} s\n", v + 1, r.update_seconds[v],
               r.stall_seconds[v]);
  fmt::print(
      "predicted update {:.4f} s   stall {:.4f} s   physical bound {:.4f} s ({:.0f}% of the "
      "prediction)\n",
      r.predicted_seconds, r.stall, r.bound_seconds,
      r.predicted_seconds > 0 ? 100 * r.bound_seconds / r.predicted_seconds : 0);
  fmt::print("bottleneck: {}\n", r.bottleneck);
  const auto& m = r.memory;
  fmt::print(
      "memory per member, host + GPU: trainer shard {:.1f} + {:.1f} GiB, leader {:.1f} + {:.1f} "
      "GiB, "
      "follower {:.1f} + {:.1f} GiB\n",
      gib(m.trainer.host), gib(m.trainer.device), gib(m.leader.host), gib(m.leader.device),
      gib(m.follower.host), gib(m.follower.device));
  if (!r.memory_short.empty()) fmt::print("DOES NOT FIT: {}\n", r.memory_short);
  fmt::print(
      "stage busy (busiest participant, last version): offload {:.4f} s  send {:.4f} s  upload "
      "{:.4f} s  "
      "broadcast {:.4f} s  apply {:.4f} s\n",
      r.stage_busy.offload, r.stage_busy.send, r.stage_busy.upload, r.stage_busy.broadcast,
      r.stage_busy.apply);
  fmt::print("{:<28} {:>10} {:>8} {:>12} {:>10}\n", "resource (busiest 12)", "busy s", "util", "GB",
             "bound s");
  for (std::size_t i = 0; i < r.resources.size() && i < 12; ++i) {
    const auto& u = r.resources[i];
    fmt::print("{:<28} {:>10.4f} {:>7.0f}% {:>12.2f} {:>10.4f}\n", u.name, u.busy_seconds,
               100 * u.utilisation, u.bytes / 1e9, u.bound_seconds);
  }
  fmt::print(
      "{} actors, {} chunk-stage events and {} transfers in {:.2f} s of wall time ({:.0f} "
      "events/s), "
      "peak RSS {:.0f} MiB\n",
      r.actors, r.trace_events, r.transfers, r.wall_seconds, events_per_second(r), peak_rss_mib());
  if (r.steady_wall_seconds > 0)
    fmt::print("after the first version: {} events in {:.2f} s ({:.0f} events/s)\n",
               r.steady_events, r.steady_wall_seconds, steady_events_per_second(r));
}

int run_one(const sim_flags& f) {
  sim_config c;
  if (auto why = load_scenario(f.scenario, f.sets, c); !why.empty()) {
    std::fprintf(stderr, "ferry sim: %s\n", why.c_str());
    return 2;
  }
  c.trace_path = f.trace_path;
  c.stop = interrupt_token();
  if (!f.json) {
    fmt::print(stderr, "ferry sim: {} actors on virtual time...\n",
               1 + c.trainers + c.instances * c.instance_size);
    c.on_version = [](std::uint64_t v, double s) {
      fmt::print(stderr, "  version {} delivered in {:.4f} s\n", v, s);
    };
    c.on_progress = [](double virtual_seconds, std::uint64_t transfers) {
      fmt::print(stderr, "  ... {:.4f} s of virtual time, {} transfers\n", virtual_seconds,
                 transfers);
    };
  }
  const auto r = run_sim(c);
  if (r.interrupted) {
    std::fprintf(stderr, "ferry sim: stopped by %s: %s\n", interrupt_name(), r.error.c_str());
    return interrupted_exit_code();
  }
  if (f.json) {
    std::printf("%s\n", to_json(r).dump().c_str());
  } else {
    print_report(c, r);
    if (!r.delivered) fmt::print("NOT DELIVERED: {}\n", r.error);
  }
  return r.delivered ? 0 : 1;
}

/// "depth=1,2,4" -> ("depth", {"1","2","4"}).
std::pair<std::string, std::vector<std::string>> axis_of(const std::string& spec) {
  const auto eq = spec.find('=');
  std::vector<std::string> values;
  if (eq == std::string::npos) return {spec, values};
  std::string rest = spec.substr(eq + 1);
  for (std::size_t at = 0; at <= rest.size();) {
    const auto comma = rest.find(',', at);
    const auto end = comma == std::string::npos ? rest.size() : comma;
    if (end > at) values.push_back(rest.substr(at, end - at));
    at = end + 1;
  }
  return {spec.substr(0, eq), values};
}

/// What a sweep keeps of a run's `--json` report.
struct run_report {
  bool delivered = false;
  std::string error, bottleneck;
  double predicted_seconds = 0, stall_seconds = 0, bound_seconds = 0, wall_seconds = 0;
};

/// The report a run printed; nothing when its output is not one.
std::optional<run_report> parse_report(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  try {
    return run_report{.delivered = j.at("delivered").get<bool>(),
                      .error = j.at("error").get<std::string>(),
                      .bottleneck = j.at("bottleneck").get<std::string>(),
                      .predicted_seconds = j.at("predicted_seconds").get<double>(),
                      .stall_seconds = j.at("stall_seconds").get<double>(),
                      .bound_seconds = j.at("bound_seconds").get<double>(),
                      .wall_seconds = j.at("wall_seconds").get<double>()};
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

/// One combination of a sweep's values: its `--set`s, the options they make (the scenario is
/// checked with them before any run starts) and, once its run ended, that run's report.
struct sweep_point {
  std::vector<std::string> sets;
  std::uint32_t depth = 0, stripes = 0;
  std::uint64_t chunk_bytes = 0;
  bool ended = false;
  std::optional<run_report> report;  ///< none when the run failed
  double seconds = 0;                ///< its process's life, start to exit
};

/// `text` inside a gnuplot string in single quotes.
std::string gnuplot_quoted(std::string_view text) {
  std::string out;
  for (const char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out;
}

/// Every combination of the axes' values, the first axis varying slowest.
std::vector<std::vector<std::string>> combinations(
    const std::vector<std::pair<std::string, std::vector<std::string>>>& axes) {
  std::vector<std::vector<std::string>> runs{{}};
  for (const auto& [key, values] : axes) {
    std::vector<std::vector<std::string>> next;
    for (const auto& run : runs)
      for (const auto& v : values) {
        auto r = run;
        r.push_back(key + "=" + v);
        next.push_back(std::move(r));
      }
    runs = std::move(next);
  }
  return runs;
}

/// Runs each point as a `ferry sim --json` process of its own, `jobs` at once (a simulation runs on
/// one thread), and calls `ended(i)` as point i's run ends, its report kept when it gave one.
/// False once SIGINT or SIGTERM arrived (or the wait for the runs failed): the runs still going
/// got the signal too and were reaped.
bool run_points(const sim_flags& f, std::vector<sweep_point>& points, unsigned jobs,
                const std::function<void(std::size_t)>& ended) {
  struct running {
    std::size_t point;
    pid_t pid;
    int out;  ///< the read end of its stdout
    std::string text;
    std::chrono::steady_clock::time_point began;
  };
  const auto self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::vector<running> runs;
  std::size_t next = 0;
  while (next < points.size() || !runs.empty()) {
    while (runs.size() < jobs && next < points.size()) {
      std::vector<std::string> args{self, "sim", f.scenario, "--json"};
      for (const auto& s : f.sets) args.insert(args.end(), {"--set", s});
      for (const auto& s : points[next].sets) args.insert(args.end(), {"--set", s});
      const auto [pid, out] = spawn_reading(args);
      if (pid < 0) {
        fmt::print(stderr, "ferry sim: cannot start run {}: {}\n", next + 1, std::strerror(errno));
        points[next].ended = true;
        ended(next++);
        continue;
      }
      runs.push_back({next++, pid, out, {}, std::chrono::steady_clock::now()});
    }
    std::vector<pollfd> waits;
    for (const auto& r : runs) waits.push_back({.fd = r.out, .events = POLLIN, .revents = 0});
    waits.push_back({.fd = interrupt_fd(), .events = POLLIN, .revents = 0});
    const bool waited = poll(waits.data(), waits.size(), -1) >= 0;
    if (!waited && errno == EINTR) continue;
    if (!waited || waits.back().revents != 0) {
      if (!waited)
        fmt::print(stderr, "ferry sim: cannot wait for the runs: {}\n", std::strerror(errno));
      std::vector<pid_t> pids;
      for (const auto& r : runs) {
        pids.push_back(r.pid);
        close(r.out);
        if (!waited) kill(r.pid, SIGTERM);
      }
      reap(pids, interrupted_grace);
      return false;
    }
    for (std::size_t k = runs.size(); k-- > 0;) {
      if (waits[k].revents == 0) continue;
      auto& r = runs[k];
      char buffer[4096];
      const auto n = read(r.out, buffer, sizeof buffer);
      if (n > 0) r.text.append(buffer, static_cast<std::size_t>(n));
      if (n > 0 || (n < 0 && errno == EINTR)) continue;  // else the end of its output
      close(r.out);
      int status = 0;
      reap_child(r.pid, status, 0);
      points[r.point].seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - r.began).count();
      // A run that did not deliver still reports (exit 1); anything else is a failed run.
      auto report = parse_report(r.text);
      points[r.point].ended = true;
      if (WIFEXITED(status) && WEXITSTATUS(status) <= 1 && report) {
        points[r.point].report = std::move(report);
      } else {
        fmt::print(stderr, "ferry sim: run {} ({}) {}\n", r.point + 1,
                   fmt::join(points[r.point].sets, " "),
                   WIFSIGNALED(status)
                       ? fmt::format("died of signal {}", WTERMSIG(status))
                       : fmt::format("exited {} without a report", WEXITSTATUS(status)));
      }
      const auto point = r.point;
      runs.erase(runs.begin() + static_cast<std::ptrdiff_t>(k));
      ended(point);
    }
  }
  return true;
}

/// "ferry.depth" and "depth" name one field.
std::string field_of(const std::string& key) {
  return key.find('.') == std::string::npos ? "ferry." + key : key;
}

int run_sweep(const sim_flags& f) {
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;
  for (const auto& s : f.sweep) {
    auto axis = axis_of(s);
    if (axis.second.empty()) {
      std::fprintf(stderr, "ferry sim: --sweep %s: expected key=v1,v2,...\n", s.c_str());
      return 2;
    }
    axes.push_back(std::move(axis));
  }
  // Each point is checked before any runs.
  std::vector<sweep_point> points;
  for (auto& run : combinations(axes)) {
    auto sets = f.sets;
    sets.insert(sets.end(), run.begin(), run.end());
    sim_config c;
    if (auto why = load_scenario(f.scenario, sets, c); !why.empty()) {
      std::fprintf(stderr, "ferry sim: %s\n", why.c_str());
      return 2;
    }
    points.push_back({.sets = std::move(run),
                      .depth = c.depth,
                      .stripes = c.stripes,
                      .chunk_bytes = c.chunk_bytes});
  }
  // Axes beyond depth, chunk and stripes get a column each, named by their field.
  std::vector<std::size_t> extra;
  for (std::size_t a = 0; a < axes.size(); ++a) {
    const auto field = field_of(axes[a].first);
    if (field != "ferry.depth" && field != "ferry.chunk" && field != "ferry.stripes")
      extra.push_back(a);
  }
  std::ofstream csv(f.csv);
  if (!csv) {
    std::fprintf(stderr, "ferry sim: --csv %s: cannot write\n", f.csv.c_str());
    return 2;
  }
  csv << "depth,chunk_mib,stripes";
  for (const auto a : extra) csv << "," << field_of(axes[a].first);
  csv << ",predicted_seconds,stall_seconds,bound_seconds,bottleneck,wall_seconds,delivered\n";
  const unsigned jobs = std::min<std::size_t>(
      f.jobs > 0 ? f.jobs : std::max(1u, std::thread::hardware_concurrency()), points.size());
  fmt::print(stderr, "ferry sim: {} runs of {}, {} at a time\n", points.size(), f.scenario, jobs);

  // A point's columns after depth and before its results: chunk, stripes and the extra axes. They
  // also key its line in the plot.
  const auto other_columns = [&](const sweep_point& p) {
    auto columns =
        fmt::format("{:g},{}", static_cast<double>(p.chunk_bytes) / (1 << 20), p.stripes);
    for (const auto a : extra) columns += "," + p.sets[a].substr(p.sets[a].find('=') + 1);
    return columns;
  };
  // Rows in the points' order, each written (and flushed) once every point before it ended; a
  // failed run has none.
  std::size_t written = 0, finished = 0, failed = 0;
  const auto write_row = [&](const sweep_point& p) {
    const auto& r = *p.report;
    csv << p.depth << "," << other_columns(p);
    csv << fmt::format(",{:.6f},{:.6f},{:.6f},{},{:.3f},{}\n", r.predicted_seconds, r.stall_seconds,
                       r.bound_seconds, r.bottleneck, r.wall_seconds, r.delivered);
  };
  const auto flush_rows = [&](bool all) {
    for (; written < points.size(); ++written) {
      if (!points[written].ended && !all) break;
      if (points[written].report) write_row(points[written]);
    }
    csv.flush();
  };
  const auto began = std::chrono::steady_clock::now();
  const bool whole = run_points(f, points, jobs, [&](std::size_t i) {
    const auto& p = points[i];
    ++finished;
    if (!p.report) {
      ++failed;
    } else {
      const auto& r = *p.report;
      fmt::print(stderr, "[{}/{}] {}: {:.4f} s (bound {:.4f} s){}\n", finished, points.size(),
                 fmt::join(p.sets, " "), r.predicted_seconds, r.bound_seconds,
                 r.delivered ? "" : " NOT DELIVERED: " + r.error);
    }
    flush_rows(false);
  });
  if (!whole) {
    flush_rows(true);  // the runs that ended, the others left out
    if (!interrupt_signal()) return 1;
    std::fprintf(stderr, "ferry sim: stopped by %s after %zu of %zu runs (%s has them)\n",
                 interrupt_name(), finished, points.size(), f.csv.c_str());
    return interrupted_exit_code();
  }
  flush_rows(true);
  csv.close();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  double lives = 0;
  for (const auto& p : points) lives += p.seconds;
  fmt::print(
      "wrote {}: {} runs in {:.1f} s, {} at a time (their processes' lives add up to {:.1f} s)\n",
      f.csv, points.size() - failed, wall, jobs, lives);
  // The answer a sweep is run for: the combination that delivers soonest.
  const sweep_point* best = nullptr;
  for (const auto& p : points) {
    if (p.report && p.report->delivered &&
        (!best || p.report->predicted_seconds < best->report->predicted_seconds))
      best = &p;
  }
  if (!best) {
    fmt::print("no run delivered: no best, no plot\n");
    return 1;
  }
  const auto& top = *best->report;
  fmt::print("best: {}: {:.4f} s, {:.2f}x its bound ({:.4f} s, {})\n", fmt::join(best->sets, " "),
             top.predicted_seconds,
             top.bound_seconds > 0 ? top.predicted_seconds / top.bound_seconds : 0,
             top.bound_seconds, top.bottleneck);
  // The plot: predicted update per depth of the runs that delivered, one line per combination of
  // the other axes. Each line's points go into the script as a data block of their own, in the
  // order of depth; the lines in the sweep's order.
  std::vector<std::pair<std::string, std::map<std::uint32_t, double>>> lines;
  for (const auto& p : points) {
    if (!p.report || !p.report->delivered) continue;
    const auto key = other_columns(p);
    auto line = std::ranges::find(lines, key, [](const auto& l) { return l.first; });
    if (line == lines.end()) line = lines.insert(line, {key, {}});
    line->second[p.depth] = p.report->predicted_seconds;
  }
  std::string title = "chunk MiB,stripes";
  for (const auto a : extra) title += "," + field_of(axes[a].first);
  std::ofstream gp(f.plot + ".gp");
  gp << fmt::format(
      "set terminal pngcairo size 1000,600 noenhanced\nset output '{}'\nset xlabel 'depth'\n"
      "set ylabel 'predicted update (s)'\nset logscale x 2\nset key below\n"
      "set title 'ferry sim --sweep: {}'\n",
      gnuplot_quoted(f.plot), gnuplot_quoted(f.scenario));
  std::vector<std::string> plots;
  for (const auto& [key, by_depth] : lines) {
    const auto block = fmt::format("$line{}", plots.size());
    gp << block << " << EOD\n";
    for (const auto& [depth, predicted] : by_depth)
      gp << fmt::format("{} {:.6f}\n", depth, predicted);
    gp << "EOD\n";
    plots.push_back(fmt::format("{} using 1:2 with linespoints title '{} {}'", block,
                                gnuplot_quoted(title), gnuplot_quoted(key)));
  }
  gp << "plot " << fmt::format("{}", fmt::join(plots, ", ")) << "\n";
  gp.close();
  // The script's path goes to gnuplot as an argument, never through a shell's parsing.
  int status = -1;
  if (const pid_t pid =
          spawn({"/bin/sh", "-c", "exec gnuplot \"$0\" > /dev/null 2>&1", f.plot + ".gp"});
      pid > 0)
    reap_child(pid, status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    fmt::print("wrote {} (gnuplot script {}.gp)\n", f.plot, f.plot);
  } else {
    fmt::print("no plot: gnuplot failed or is missing (script in {}.gp)\n", f.plot);
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace

void add_sim(CLI::App& app, command_table& commands) {
  auto f = std::make_shared<sim_flags>();
  auto* sim = app.add_subcommand(
      "sim", "a whole cluster's weight update on virtual time, from a scenario file");
  sim->add_option("scenario", f->scenario, "scenario (TOML; see examples/sim/)")->required();
  sim->add_flag("--json", f->json, "print the result as one JSON object");
  sim->add_option("--trace", f->trace_path, "write the simulated timeline as Chrome trace JSON");
  sim->add_option("--set", f->sets,
                  "override a scenario field: key=value (ferry.depth=8, hardware.nic_gbps=200)");
  sim->add_option("--sweep", f->sweep,
                  "sweep scenario fields, every combination: depth=1,2,4 chunk=16MiB,64MiB "
                  "hardware.nic_gbps=200,400")
      ->expected(1, 8);
  sim->add_option("--csv", f->csv, "where --sweep writes its CSV")->capture_default_str();
  sim->add_option("--plot", f->plot, "where --sweep writes its PNG")->capture_default_str();
  sim->add_option(
         "--jobs", f->jobs,
         "how many of a sweep's runs go at once, each with its own memory (default: one per core)")
      ->check(CLI::Range(1, 256));
  commands[sim] = [f] {
    log::set_level(log::level::warn);
    return f->sweep.empty() ? run_one(*f) : run_sweep(*f);
  };
}

}  // namespace ferry::cli
