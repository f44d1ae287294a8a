#pragma once
/// Messages of the NCCL instance group: the ncclUniqueId travels from rank 0 to the others.
/// Kinds 129-191 belong to collectives; never reuse one.
#include <cstdint>
#include <vector>

#include "runtime/message.hpp"
#include "runtime/message_registry.hpp"

namespace ferry {

/// Rank 0 -> member: the ncclUniqueId of the group of `epoch` (NCCL_UNIQUE_ID_BYTES bytes).
struct nccl_group_id {
  static constexpr msg_kind kind{129};
  std::uint32_t epoch = 0;
  std::uint32_t size = 0;  ///< ranks in the group
  std::vector<std::uint8_t> id;
  FERRY_DEFINE_MAP(epoch, size, id)
};

/// Member -> rank 0: this member built its group of `epoch` and waits for the id. Rank 0 answers
/// every join with the id, so neither side depends on which one set up first.
struct nccl_group_join {
  static constexpr msg_kind kind{130};
  std::uint32_t epoch = 0;
  std::uint32_t rank = 0;
  FERRY_DEFINE_MAP(epoch, rank)
};

/// Adds the messages above to `registry`.
void register_nccl_messages(message_registry& registry);

}  // namespace ferry
