#pragma once
/// What a job's members will hold, from the first plan its coordinator would make, before any
/// member exists: what the demo and `ferry local` check against this host before they start.
#include <optional>
#include <span>
#include <string>

#include "actors/member_memory.hpp"
#include "jobs/local_job.hpp"

namespace ferry {

/// Where a job's members hold their tensors.
struct member_places {
  bool trainers_on_gpus = false;
  bool workers_on_gpus = false;
};

/// What the members of `config`'s job of `model` hold, from the plan their registrations make;
/// an error saying why no plan can be made of them.
result<job_memory> expected_memory(std::span<const tensor_spec> model, const job_config& config,
                                   member_places places, std::string& why);

/// Why the job cannot fit in this host's available memory, with the figures; nothing when it
/// fits, or when the host does not say what it has.
std::optional<std::string> refuse_beyond_host(std::span<const tensor_spec> model,
                                              const job_config& config, member_places places);

}  // namespace ferry
