#pragma once
/// How the CLI shows a finished job: a summary table for people, one JSON object for programs.
#include <nlohmann/json.hpp>
#include <string>

#include "jobs/local_job.hpp"

namespace ferry::cli {

/// The summary table: one row per version, then totals and the verdict.
std::string summary_table(const job_result& r);
/// `{"verified", "workers", "versions", "bytes", "seconds", "gbps", ...}`.
nlohmann::json summary_json(const job_result& r);

}  // namespace ferry::cli
