#include "cli/options.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "actors/plan.hpp"

namespace ferry::cli {

void add_job_options(CLI::App& app, job_config& c) {
  app.add_option("--trainers", c.trainers, "trainer shards")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--instances", c.instances, "rollout instances")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--workers", c.workers_per_instance, "workers per instance")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--model-bytes", c.model_bytes, "synthetic model size (e.g. 1GiB, 256MiB)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--chunk-bytes", c.chunk_bytes, "chunk size, a multiple of 256 (e.g. 64MiB)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--depth", c.depth, "chunks in flight per stage")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option(
         "--stripes", c.stripes,
         "leaders per instance, each receiving one stripe of every chunk; 0: every worker leads "
         "when they hold their tensors on GPUs, else one")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app.add_option("--versions", c.versions, "versions to publish")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--transport", c.transport,
                 "inproc, tcp, cma (tcp links, same-host copies) or fabric")
      ->check(CLI::IsMember({"inproc", "tcp", "cma", "fabric"}))
      ->capture_default_str();
  app.add_flag("--shared-host-copies", c.shared_host_copies,
               "trainers keep host copies in shared memory and leaders read chunks there in place, "
               "with no point-to-point copy (every node on one host)");
  app.add_option_function<std::string>(
         "--p2p", [&c](const std::string& name) { c.p2p = *parse_p2p_mode(name); },
         "how chunks go between a trainer and a worker whose tensors are both on GPUs: auto (GPU "
         "to GPU "
         "on one host where the worker's GPU reads the trainer's, else through host memory), "
         "device "
         "(GPU to GPU wherever both share a host) or host (always through host memory)")
      ->check(CLI::IsMember({"auto", "device", "host"}))
      ->default_str("auto");
  app.add_option_function<std::string>(
         "--shard-rollout",
         [&c](const std::string& name) { c.shard_rollout = *parse_rollout_sharding(name); },
         "how each instance's workers split the model: none (each holds all of it), ep (experts; a "
         "dense "
         "layer's MLP counts as one), tp (every tensor's rows) or pp-tp (two pipeline stages of "
         "tensor-parallel ranks, norms whole on each rank of their stage) or ep-tp (experts as ep, "
         "every "
         "other tensor's rows as tp, norms whole)")
      ->check(CLI::IsMember({"none", "ep", "tp", "pp-tp", "ep-tp"}))
      ->default_str("none");
  app.add_flag("!--no-checksums", c.checksums, "skip the per-chunk xxh3 check (benchmarks)");
  app.add_flag("!--no-verify", c.verify, "skip per-tensor digests and the final byte compare");
  app.add_option("--trace", c.trace_path,
                 "write the timeline of every stage of every chunk here, as Chrome trace JSON "
                 "(Perfetto opens it)");
}

std::string check_job_options(const job_config& c) {
  if (auto no = chunk_bytes_refusal(c.chunk_bytes))
    return "--chunk-bytes " + std::to_string(c.chunk_bytes) + ": " + *no;
  if (c.model_bytes < (1u << 20))
    return "--model-bytes " + std::to_string(c.model_bytes) + ": at least 1MiB";
  if (!c.trace_path.empty() && !std::ofstream(c.trace_path)) {
    return "--trace " + c.trace_path + ": cannot be written (" + std::strerror(errno) + ")";
  }
  return "";
}

}  // namespace ferry::cli
