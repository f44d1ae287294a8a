#pragma once
/// Scenario files for `ferry sim` (TOML): the hardware, the model, the placement, ferry's options
/// and membership events. examples/sim/ has one per measured layout and one for Kimi-K2.
#include <optional>
#include <string>
#include <vector>

#include "jobs/sim_job.hpp"

namespace ferry {

/// Reads `path`, applies each `key=value` of `sets` (a dotted key: "ferry.depth=8"; a bare
/// ferry option: "depth=8"), and fills `out`. Returns one line naming the file and the field
/// when the scenario is wrong; empty when it is fine.
std::string load_scenario(const std::string& path, const std::vector<std::string>& sets,
                          sim_config& out);

/// "64MiB", "1.5GB", "4096": bytes; nullopt when it is none of those.
std::optional<std::uint64_t> parse_bytes(std::string_view text);

}  // namespace ferry
