#include <cstdio>
#include <memory>

#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "cli/report.hpp"
#include "runtime/log.hpp"

namespace ferry::cli {

/// `ferry demo`: a whole job in this process on host memory; also what plain `ferry` runs.
void add_demo(CLI::App& app, command_table& commands) {
  auto* demo = app.add_subcommand("demo", "an in-process job on host memory (the default)");
  auto config = std::make_shared<job_config>();
  auto json = std::make_shared<bool>(false);
  add_job_options(*demo, *config);
  demo->add_flag("--json", *json, "print one JSON object instead of the table");

  auto run = [config, json] {
    if (auto error = check_job_options(*config); !error.empty()) {
      std::fprintf(stderr, "ferry demo: %s\n", error.c_str());
      return 2;
    }
    log::info("demo: {} trainers, {} instances x {} workers, {} MiB model, {} MiB chunks, depth {}, {} versions over {}",
              config->trainers, config->instances, config->workers_per_instance, config->model_bytes >> 20,
              config->chunk_bytes >> 20, config->depth, config->versions, config->transport);
    const auto result = run_local_job(*config, [](const std::string& line) { log::info("{}", line); });
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
