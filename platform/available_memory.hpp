#pragma once
/// How much more host memory this process may take before the kernel reclaims what it should not
/// or kills it: what a job compares its members' needs with before it allocates them.
#include <cstdint>
#include <optional>

namespace ferry {

/// The kernel's estimate of memory available without swapping (`MemAvailable`), lowered to what
/// the process's memory cgroup (v2 or v1) still allows; none when neither can be read.
std::optional<std::uint64_t> available_host_memory();

}  // namespace ferry
