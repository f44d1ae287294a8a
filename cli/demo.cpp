#include <algorithm>
#include <cstdio>
#include <memory>

#include "actors/synthetic_model.hpp"
#include "cli/commands.hpp"
#include "cli/gpu.hpp"
#include "cli/interrupt.hpp"
#include "cli/job.hpp"
#include "cli/options.hpp"
#include "cli/report.hpp"
#include "jobs/job_memory.hpp"
#include "runtime/log.hpp"

namespace ferry::cli {

namespace {

/// `ferry demo --gpu`: the same job as processes, one per GPU of this host. Unless flags say
/// otherwise: one trainer shard and one instance of the other GPUs (on a single GPU, a trainer and
/// a worker share it), reading GPU to GPU where the GPUs allow (`--p2p`), else the trainer's host
/// copy in place, with cma for the control links and any write.
int run_gpu_demo(const CLI::App& demo, const job_config& config, bool json) {
  process_flags f{.job = config, .json = json, .gpus = true};
  const int gpus = visible_gpus();
  if (gpus < 1) return std::fprintf(stderr, "ferry demo --gpu: no GPU visible\n"), 2;
  if (!demo.count("--trainers")) f.job.trainers = 1;
  if (!demo.count("--instances")) f.job.instances = 1;
  if (!demo.count("--workers"))
    f.job.workers_per_instance = std::max(1, (gpus - 1) / static_cast<int>(f.job.instances));
  if (gpus == 1)
    f.gpu_list.assign(f.job.trainers + f.job.instances * f.job.workers_per_instance, 0);
  if (!demo.count("--transport")) {
    f.job.transport = "cma";
    f.job.shared_host_copies = true;
  }
  log::info("demo: {} trainer GPU(s), {} instance(s) x {} GPUs, {} MiB model, over {}, p2p {}{}",
            f.job.trainers, f.job.instances, f.job.workers_per_instance, f.job.model_bytes >> 20,
            f.job.transport, p2p_mode_name(f.job.p2p),
            f.job.shared_host_copies ? " (else the trainers' host copies read in place)" : "");
  return run_local(f);
}

}  // namespace

/// `ferry demo`: a whole job in this process on host memory; also what plain `ferry` runs.
void add_demo(CLI::App& app, command_table& commands) {
  auto* demo = app.add_subcommand("demo", "an in-process job on host memory (the default)");
  auto config = std::make_shared<job_config>();
  auto json = std::make_shared<bool>(false);
  auto gpu = std::make_shared<bool>(false);
  add_job_options(*demo, *config);
  demo->add_flag("--json", *json, "print one JSON object instead of the table");
  demo->add_flag(
      "--gpu", *gpu,
      "the job on this host's GPUs instead, one process per GPU (by default one trainer and one "
      "instance of the other GPUs; one GPU: a trainer and a worker share it)");

  auto run = [demo, config, json, gpu] {
    if (*gpu) return run_gpu_demo(*demo, *config, *json);
    if (auto error = check_job_options(*config); !error.empty()) {
      std::fprintf(stderr, "ferry demo: %s\n", error.c_str());
      return 2;
    }
    if (auto error = refuse_beyond_host(synthetic_transformer(config->model_bytes), *config, {})) {
      std::fprintf(stderr, "ferry demo: %s\n", error->c_str());
      return 2;
    }
    log::info(
        "demo: {} trainers, {} instances x {} workers, {} MiB model, {} MiB chunks, depth {}, {} "
        "versions over {}",
        config->trainers, config->instances, config->workers_per_instance,
        config->model_bytes >> 20, config->chunk_bytes >> 20, config->depth, config->versions,
        config->transport);
    const auto result = run_local_job(
        *config, [](const std::string& line) { log::info("{}", line); }, interrupt_token());
    if (result.interrupted) {
      std::fprintf(stderr, "ferry demo: %s: %s\n", interrupt_name(), result.error.c_str());
      return interrupted_exit_code();
    }
    if (*json) {
      std::printf("%s\n", summary_json(result).dump().c_str());
    } else {
      std::printf("%s", summary_table(result).c_str());
    }
    return result.ok && (result.verified || !config->verify) ? 0 : 1;
  };
  commands[demo] = run;
  commands[nullptr] = run;
}

}  // namespace ferry::cli
