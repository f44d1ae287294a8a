#include "collectives/nccl/nccl_messages.hpp"

namespace ferry {

void register_nccl_messages(message_registry& registry) {
  registry.add<nccl_group_id>("nccl_group_id");
  registry.add<nccl_group_join>("nccl_group_join");
}

}  // namespace ferry
