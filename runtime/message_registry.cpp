#include "runtime/message_registry.hpp"

#include <stdexcept>

#include "runtime/messages.hpp"

namespace ferry {

void message_registry::add_entry(msg_kind kind, entry e) {
  if (by_kind_.size() <= kind) by_kind_.resize(kind + 1u);
  auto& slot = by_kind_[kind];
  if (slot) {
    if (slot->name != e.name)
      throw std::logic_error("message kind " + std::to_string(kind) + " registered twice");
    return;
  }
  slot = std::move(e);
  ++size_;
}

const message_registry::entry* message_registry::find(msg_kind kind) const {
  return kind < by_kind_.size() && by_kind_[kind] ? &*by_kind_[kind] : nullptr;
}

void register_runtime_messages(message_registry& registry) {
  registry.add<ping>("ping");
  registry.add<pong>("pong");
}

message_registry runtime_messages() {
  message_registry r;
  register_runtime_messages(r);
  return r;
}

}  // namespace ferry
