#include "protocol/protocol.hpp"

#include "actors/messages.hpp"
#include "collectives/host/chain_messages.hpp"
#include "collectives/nccl/nccl_messages.hpp"

namespace ferry {

const message_registry& protocol() {
  static const message_registry registry = [] {
    message_registry r;
    register_runtime_messages(r);
    register_actor_messages(r);
    register_collective_messages(r);
    register_nccl_messages(r);
    return r;
  }();
  return registry;
}

}  // namespace ferry
