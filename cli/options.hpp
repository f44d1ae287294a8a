#pragma once
/// Job flags shared by `demo`, `local`, `coordinator`, `node` and `bench`.
#include <CLI/CLI.hpp>

#include "jobs/local_job.hpp"

namespace ferry::cli {

/// Adds the job-shape flags to `app`, bound to `config`.
void add_job_options(CLI::App& app, job_config& config);

/// Checks what CLI11 cannot: returns a one-line error naming the flag, or "".
std::string check_job_options(const job_config& config);

}  // namespace ferry::cli
