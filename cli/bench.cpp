/// `ferry bench` (CPU mode): sweeps transport, chunk size and depth over in-process jobs and
/// judges each whole update against its slowest stage measured alone, in the same run.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "actors/plan.hpp"
#include "bench/stage_alone.hpp"
#include "cli/commands.hpp"
#include "cli/interrupt.hpp"
#include "jobs/local_job.hpp"
#include "runtime/log.hpp"

namespace ferry::cli {
namespace {

struct bench_flags {
  std::vector<std::string> transports{"inproc", "tcp"};
  std::vector<std::uint32_t> depths{1, 2, 4, 8};
  std::vector<std::uint64_t> chunks{4ull << 20, 16ull << 20, 64ull << 20};
  std::uint64_t model_bytes = 512ull << 20;
  std::uint32_t trainers = 2;
  std::uint32_t instances = 1;
  std::uint32_t workers = 3;
  std::uint32_t versions = 5;
  int stage_repeats = 3;
  std::string csv;
};

/// One swept point: the job's update time and each stage alone.
struct point {
  std::string transport;
  std::uint64_t chunk = 0;
  std::uint32_t depth = 0;
  std::size_t measured = 0;  ///< versions the median is taken over
  double seconds = 0;        ///< median update time over versions 2..N
  double gbps = 0;
  std::uint32_t ref_depth = 0;
  double speedup = 0;  ///< reference depth's seconds / this point's seconds (same chunk)
  bench::stage_seconds alone;
  stage_times busy;  ///< medians of the job's busiest participant per stage
  double stall = 0;  ///< median time the trainers waited for their offload
  double load1 = 0;  ///< 1-minute load average when the point started

  double over_bound() const { return seconds / alone.slowest(); }
  double over_sum() const { return seconds / alone.sum(); }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string size_text(std::uint64_t bytes) {
  if (bytes % (1ull << 30) == 0) return fmt::format("{}GiB", bytes >> 30);
  if (bytes % (1ull << 20) == 0) return fmt::format("{}MiB", bytes >> 20);
  if (bytes % (1ull << 10) == 0) return fmt::format("{}KiB", bytes >> 10);
  return fmt::format("{}B", bytes);
}

/// The first field of /proc/loadavg; 0 where there is none.
double load_average() {
  std::ifstream in("/proc/loadavg");
  double load = 0;
  in >> load;
  return load;
}

std::string machine_line() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  in >> key >> kib;
  std::ifstream loadavg("/proc/loadavg");
  std::string l1, l5, l15;
  loadavg >> l1 >> l5 >> l15;
  return fmt::format("{} cores, {:.1f} GiB memory, load average {} {} {}",
                     std::thread::hardware_concurrency(), kib / 1024.0 / 1024.0, l1, l5, l15);
}

/// The update-time statistics of a finished job, over versions 2..N (version 1 warms up).
void take_versions(const job_result& r, point& p) {
  const std::size_t first = r.versions.size() > 1 ? 1 : 0;
  std::vector<double> seconds, offload, send, broadcast, apply, stall;
  for (std::size_t i = first; i < r.versions.size(); ++i) {
    const auto& v = r.versions[i];
    seconds.push_back(v.seconds);
    offload.push_back(v.busy.offload);
    send.push_back(v.busy.send);
    broadcast.push_back(v.busy.broadcast);
    apply.push_back(v.busy.apply);
    stall.push_back(v.offloaded_seconds);
  }
  p.measured = seconds.size();
  p.seconds = median(seconds);
  p.gbps = p.seconds > 0 ? static_cast<double>(r.model_bytes) / p.seconds / 1e9 : 0;
  p.busy = {.offload = median(offload),
            .send = median(send),
            .broadcast = median(broadcast),
            .apply = median(apply)};
  p.stall = median(stall);
}

std::string table(const bench_flags& f, const std::string& transport,
                  const std::vector<point>& points) {
  std::string out = fmt::format(
      "\n{}: {} model, {} trainer shards -> {} instance(s) x {} workers, median of versions "
      "2..{}\n",
      transport, size_text(f.model_bytes), f.trainers, f.instances, f.workers, f.versions);
  out += fmt::format(
      "{:>7} {:>5} {:>9} {:>6} {:>8} | alone s: {:>7} {:>7} {:>9} {:>7} | {:>9} {:>11} {:>9}\n",
      "chunk", "depth", "median s", "GB/s", "x ref", "offload", "send", "broadcast", "apply",
      "bound", "whole/bound", "whole/sum");
  for (const auto& p : points) {
    if (p.transport != transport) continue;
    out += fmt::format(
        "{:>7} {:>5} {:>9.3f} {:>6.2f} {:>8.2f} | {:>16.3f} {:>7.3f} {:>9.3f} {:>7.3f} | {:>9} "
        "{:>11.2f} {:>9.2f}\n",
        size_text(p.chunk), p.depth, p.seconds, p.gbps, p.speedup, p.alone.offload, p.alone.send,
        p.alone.broadcast, p.alone.apply, p.alone.slowest_name(), p.over_bound(), p.over_sum());
  }
  out +=
      "x ref: the same chunk's time at the smallest depth swept / this time. bound: the slowest "
      "stage alone.\n";
  return out;
}

/// The headline of one transport: the best point, its chunk's reference depth, the bound.
std::string headline(const std::string& transport, const std::vector<point>& points) {
  const point* best = nullptr;
  for (const auto& p : points) {
    if (p.transport == transport && (!best || p.seconds < best->seconds)) best = &p;
  }
  if (!best) return "";
  const point* ref = nullptr;
  for (const auto& p : points) {
    if (p.transport == transport && p.chunk == best->chunk && p.depth == best->ref_depth) ref = &p;
  }
  return fmt::format(
      "headline {}: best depth {} at chunk {}: {:.3f} s ({:.2f} GB/s); depth {} at that chunk "
      "{:.3f} s: "
      "depth-{}/best-depth ratio {:.2f}; whole/bound at best {:.2f} (bound: {} alone {:.3f} s), "
      "whole/sum-of-stages {:.2f}\n",
      transport, best->depth, size_text(best->chunk), best->seconds, best->gbps, best->ref_depth,
      ref->seconds, best->ref_depth, best->speedup, best->over_bound(), best->alone.slowest_name(),
      best->alone.slowest(), best->over_sum());
}

std::string csv_text(const bench_flags& f, const std::vector<point>& points) {
  std::string out =
      "transport,model_bytes,trainers,instances,workers,chunk_bytes,depth,versions_measured,median_"
      "seconds,gbps,"
      "ref_depth,speedup_vs_ref,offload_alone_s,send_alone_s,broadcast_alone_s,apply_alone_s,bound_"
      "stage,"
      "bound_seconds,whole_over_bound,whole_over_sum,busy_offload_s,busy_send_s,busy_broadcast_s,"
      "busy_apply_s,"
      "stall_s,load1\n";
  for (const auto& p : points) {
    out += fmt::format(
        "{},{},{},{},{},{},{},{},{:.6f},{:.4f},{},{:.4f},{:.6f},{:.6f},{:.6f},{:.6f},{},{:.6f},{:."
        "4f},{:.4f},"
        "{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.2f}\n",
        p.transport, f.model_bytes, f.trainers, f.instances, f.workers, p.chunk, p.depth,
        p.measured, p.seconds, p.gbps, p.ref_depth, p.speedup, p.alone.offload, p.alone.send,
        p.alone.broadcast, p.alone.apply, p.alone.slowest_name(), p.alone.slowest(), p.over_bound(),
        p.over_sum(), p.busy.offload, p.busy.send, p.busy.broadcast, p.busy.apply, p.stall,
        p.load1);
  }
  return out;
}

std::string check(const bench_flags& f) {
  for (auto c : f.chunks) {
    if (c < tensor_alignment || c % tensor_alignment != 0) {
      return fmt::format("--chunk-bytes {}: must be a positive multiple of {}", c,
                         tensor_alignment);
    }
  }
  if (f.model_bytes < (1u << 20))
    return fmt::format("--model-bytes {}: at least 1MiB", f.model_bytes);
  return "";
}

job_config job_for(const bench_flags& f, const std::string& transport, std::uint64_t chunk,
                   std::uint32_t depth) {
  return {.trainers = f.trainers,
          .instances = f.instances,
          .workers_per_instance = f.workers,
          .model_bytes = f.model_bytes,
          .chunk_bytes = chunk,
          .depth = depth,
          .versions = f.versions,
          .transport = transport,
          .checksums = false,
          .verify = false};
}

/// SIGINT or SIGTERM ended the sweep: says so, and the exit status.
int interrupted(const std::string& during) {
  std::fprintf(stderr, "ferry bench: %s during %s\n", interrupt_name(), during.c_str());
  return interrupted_exit_code();
}

int run_bench(bench_flags f) {
  if (auto error = check(f); !error.empty()) {
    std::fprintf(stderr, "ferry bench: %s\n", error.c_str());
    return 2;
  }
  std::sort(f.depths.begin(), f.depths.end());
  f.depths.erase(std::unique(f.depths.begin(), f.depths.end()), f.depths.end());
  const std::uint32_t ref_depth = f.depths.front();
  std::printf("ferry bench: %s\n", machine_line().c_str());
  std::fflush(stdout);

  // Sanity first: the pipeline at its deepest setting, with checksums and digests, must deliver
  // byte-identical weights on every transport before any of its timings mean anything.
  for (const auto& transport : f.transports) {
    auto config = job_for(f, transport, f.chunks.front(), f.depths.back());
    config.versions = 2;
    config.checksums = config.verify = true;
    log::info("bench: sanity job on {} (chunk {}, depth {}, 2 versions, checksums and digests on)",
              transport, size_text(config.chunk_bytes), config.depth);
    const auto r = run_local_job(config, {}, interrupt_token());
    if (r.interrupted) return interrupted("the sanity job on " + transport);
    const bool good = r.ok && r.verified;
    std::printf(
        "sanity %s: chunk %s depth %u, %zu versions: %s\n", transport.c_str(),
        size_text(config.chunk_bytes).c_str(), config.depth, r.versions.size(),
        good ? "verified, every worker holds the trainers' bytes" : ("FAILED: " + r.error).c_str());
    std::fflush(stdout);
    if (!good) return 1;
  }

  std::vector<point> points;
  const std::size_t total = f.transports.size() * f.chunks.size() * f.depths.size();
  for (const auto& transport : f.transports) {
    for (auto chunk : f.chunks) {
      for (auto depth : f.depths) {
        point p{.transport = transport,
                .chunk = chunk,
                .depth = depth,
                .ref_depth = ref_depth,
                .load1 = load_average()};
        std::string why;
        auto alone = bench::measure_stages({.trainers = f.trainers,
                                            .instances = f.instances,
                                            .workers_per_instance = f.workers,
                                            .model_bytes = f.model_bytes,
                                            .chunk_bytes = chunk,
                                            .depth = depth,
                                            .transport = transport},
                                           f.stage_repeats, why, interrupt_token());
        const auto where = fmt::format("{} chunk {} depth {}", transport, size_text(chunk), depth);
        if (interrupt_signal()) return interrupted("the stage measurement of " + where);
        if (!alone) {
          std::fprintf(stderr, "ferry bench: %s chunk %s depth %u: %s\n", transport.c_str(),
                       size_text(chunk).c_str(), depth, why.c_str());
          return 1;
        }
        p.alone = *alone;
        const auto r = run_local_job(job_for(f, transport, chunk, depth), {}, interrupt_token());
        if (r.interrupted) return interrupted("the job of " + where);
        if (!r.ok) {
          std::fprintf(stderr, "ferry bench: %s chunk %s depth %u: the job failed: %s\n",
                       transport.c_str(), size_text(chunk).c_str(), depth, r.error.c_str());
          return 1;
        }
        take_versions(r, p);
        for (const auto& q : points) {
          if (q.transport == transport && q.chunk == chunk && q.depth == ref_depth)
            p.speedup = q.seconds / p.seconds;
        }
        if (depth == ref_depth) p.speedup = 1;
        points.push_back(p);
        log::info(
            "bench [{}/{}] {} chunk {} depth {}: median {:.3f} s ({:.2f} GB/s), x{:.2f} vs depth "
            "{}; alone: "
            "offload {:.3f} send {:.3f} broadcast {:.3f} apply {:.3f} s; whole/bound {:.2f} ({}); "
            "load {:.2f}",
            points.size(), total, transport, size_text(chunk), depth, p.seconds, p.gbps, p.speedup,
            ref_depth, p.alone.offload, p.alone.send, p.alone.broadcast, p.alone.apply,
            p.over_bound(), p.alone.slowest_name(), p.load1);
      }
    }
    std::printf("%s", table(f, transport, points).c_str());
    std::fflush(stdout);
  }

  std::printf("\n");
  for (const auto& transport : f.transports) std::printf("%s", headline(transport, points).c_str());
  std::printf("machine at the end: %s\n", machine_line().c_str());
  if (!f.csv.empty()) {
    std::ofstream out(f.csv, std::ios::trunc);
    out << csv_text(f, points);
    if (!out) {
      std::fprintf(stderr, "ferry bench: cannot write %s\n", f.csv.c_str());
      return 1;
    }
    std::printf("wrote %s\n", f.csv.c_str());
  }
  return 0;
}

}  // namespace

/// `ferry bench`: the depth and chunk-size sweep, each point against its stages alone.
void add_bench(CLI::App& app, command_table& commands) {
  auto* bench = app.add_subcommand("bench",
                                   "sweep depth and chunk size on the inproc and tcp paths; whole "
                                   "update vs. the slowest stage alone");
  auto f = std::make_shared<bench_flags>();
  bench->add_option("--transports", f->transports, "transports to sweep")
      ->delimiter(',')
      ->check(CLI::IsMember({"inproc", "tcp"}))
      ->capture_default_str();
  bench->add_option("--depths", f->depths, "depths to sweep (the smallest is the reference)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  bench
      ->add_option("--chunk-bytes", f->chunks,
                   "chunk sizes to sweep, multiples of 256 (e.g. 4MiB,16MiB)")
      ->delimiter(',')
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  bench->add_option("--model-bytes", f->model_bytes, "synthetic model size (e.g. 512MiB)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  bench->add_option("--trainers", f->trainers, "trainer shards")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  bench->add_option("--instances", f->instances, "rollout instances")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  bench->add_option("--workers", f->workers, "workers per instance")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  bench->add_option("--versions", f->versions, "versions per job; the median is over versions 2..N")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  bench
      ->add_option("--stage-repeats", f->stage_repeats,
                   "repeats of each stage-alone measurement (median)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  bench->add_option("--csv", f->csv, "write one row per swept point to this file");
  commands[bench] = [f] { return run_bench(*f); };
}

}  // namespace ferry::cli
