#include "collectives/host/chain_messages.hpp"

namespace ferry {

void register_collective_messages(message_registry& registry) {
  registry.add<chain_ready>("chain_ready");
}

}  // namespace ferry
