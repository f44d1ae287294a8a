#pragma once
/// Messages of the host chain broadcast. Kinds 128-191 belong to collectives; never reuse one.
#include <cstdint>

#include "runtime/message.hpp"
#include "runtime/message_registry.hpp"
#include "runtime/transport.hpp"

namespace ferry {

/// Member -> predecessor: write broadcast number `seq` of group `epoch` into `region` at `offset`.
struct chain_ready {
  static constexpr msg_kind kind{128};
  std::uint32_t epoch = 0;
  std::uint64_t seq = 0;
  region_desc region;
  std::uint64_t offset = 0;
  FERRY_DEFINE_MAP(epoch, seq, region, offset)
};

void register_collective_messages(message_registry& registry);

}  // namespace ferry
