#pragma once
/// Digests of a plan, which members compare instead of the plans themselves.
#include <cstdint>

#include "actors/plan.hpp"

namespace ferry {

/// What fixes chunk ids: the table, segments and chunks, where each lies and what it packs.
std::uint64_t layout_digest(const plan& p);
/// The whole plan: its layout, and who is in it, who hears what, and the options.
std::uint64_t plan_digest(const plan& p);

}  // namespace ferry
