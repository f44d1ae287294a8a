/// `ferry sim SCENARIO.toml`: a whole cluster's weight update on virtual time (jobs/sim_job), its
/// report, and sweeps of ferry's options written as CSV and a plot.
#include <fmt/format.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/interrupt.hpp"
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
      "depth {}, "
      "stripes {}\n",
      bytes / 1e9, c.model.size(), c.trainers, c.instances, c.instance_size, c.chunk_bytes >> 20,
      c.depth, c.stripes);
  for (std::size_t v = 0; v < r.update_seconds.size(); ++v)
    fmt::print("version {}: update {:.4f} s, trainer stall {:.4f} s\n", v + 1, r.update_seconds[v],
               r.stall_seconds[v]);
  fmt::print(
      "predicted update {:.4f} s   stall {:.4f} s   physical bound {:.4f} s ({:.0f}% of the "
      "prediction)\n",
      r.predicted_seconds, r.stall, r.bound_seconds,
      r.predicted_seconds > 0 ? 100 * r.bound_seconds / r.predicted_seconds : 0);
  fmt::print("bottleneck: {}\n", r.bottleneck);
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
      "{} actors, {} chunk-stage events and {} transfers in {:.2f} s of wall time ({:.0f} events/s), "
      "peak RSS {:.0f} MiB\n",
      r.actors, r.trace_events, r.transfers, r.wall_seconds, events_per_second(r), peak_rss_mib());
  if (r.steady_wall_seconds > 0)
    fmt::print("after the first version: {} events in {:.2f} s ({:.0f} events/s)\n", r.steady_events,
               r.steady_wall_seconds, steady_events_per_second(r));
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
      fmt::print(stderr, "  ... {:.4f} s of virtual time, {} transfers\n", virtual_seconds, transfers);
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
  // Every combination, checked before any runs.
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
  std::vector<sim_config> configs;
  for (const auto& run : runs) {
    sim_config c;
    auto sets = f.sets;
    sets.insert(sets.end(), run.begin(), run.end());
    if (auto why = load_scenario(f.scenario, sets, c); !why.empty()) {
      std::fprintf(stderr, "ferry sim: %s\n", why.c_str());
      return 2;
    }
    configs.push_back(std::move(c));
  }
  std::ofstream csv(f.csv);
  if (!csv) {
    std::fprintf(stderr, "ferry sim: --csv %s: cannot write\n", f.csv.c_str());
    return 2;
  }
  csv << "depth,chunk_mib,stripes,predicted_seconds,stall_seconds,bound_seconds,bottleneck,wall_"
         "seconds\n";
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const auto& c = configs[i];
    auto run = c;
    run.stop = interrupt_token();
    const auto r = run_sim(run);
    if (r.interrupted) {
      std::fprintf(stderr, "ferry sim: stopped by %s after %zu of %zu runs\n", interrupt_name(), i, configs.size());
      return interrupted_exit_code();
    }
    fmt::print(stderr, "[{}/{}] depth {} chunk {} MiB stripes {}: {:.4f} s (bound {:.4f} s){}\n",
               i + 1, configs.size(), c.depth, c.chunk_bytes >> 20, c.stripes, r.predicted_seconds,
               r.bound_seconds, r.delivered ? "" : " NOT DELIVERED: " + r.error);
    csv << fmt::format("{},{},{},{:.6f},{:.6f},{:.6f},{},{:.3f}\n", c.depth, c.chunk_bytes >> 20,
                       c.stripes, r.predicted_seconds, r.stall, r.bound_seconds, r.bottleneck,
                       r.wall_seconds);
  }
  csv.close();
  fmt::print("wrote {}\n", f.csv);
  // The plot: predicted update per depth, one line per (chunk, stripes).
  const std::string script = fmt::format(
      "set terminal pngcairo size 1000,600 noenhanced; set output '{}'; set datafile separator ',';"
      "set xlabel 'depth'; set ylabel 'predicted update (s)'; set logscale x 2; set key outside "
      "right;"
      "set title 'ferry sim --sweep: {}';"
      "plot for [k in system(\"tail -n +2 {} | cut -d, -f2,3 | sort -u -t, -k1n -k2n | tr '\\\\n' "
      "' '\")] "
      "'{}' using 1:((stringcolumn(2).','.stringcolumn(3)) eq k ? $4 : 1/0) with linespoints "
      "title 'chunk MiB,stripes '.k",
      f.plot, f.scenario, f.csv, f.csv);
  std::ofstream gp(f.plot + ".gp");
  gp << script << "\n";
  gp.close();
  if (std::system(fmt::format("gnuplot {}.gp > /dev/null 2>&1", f.plot).c_str()) == 0) {
    fmt::print("wrote {} (gnuplot script {}.gp)\n", f.plot, f.plot);
  } else {
    fmt::print("no plot: gnuplot failed or is missing (script in {}.gp)\n", f.plot);
  }
  return 0;
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
                  "sweep ferry options: depth=1,2,4 chunk=16MiB,64MiB stripes=1,2")
      ->expected(1, 8);
  sim->add_option("--csv", f->csv, "where --sweep writes its CSV")->capture_default_str();
  sim->add_option("--plot", f->plot, "where --sweep writes its PNG")->capture_default_str();
  commands[sim] = [f] {
    log::set_level(log::level::warn);
    return f->sweep.empty() ? run_one(*f) : run_sweep(*f);
  };
}

}  // namespace ferry::cli
