#include "runtime/message_registry.hpp"

#include <stdexcept>

#include "runtime/messages.hpp"

namespace ferry {

void message_registry::add_entry(msg_kind kind, entry e) {
  auto [it, inserted] = entries_.emplace(kind, std::move(e));
  if (!inserted && it->second.name != e.name) {
    throw std::logic_error("message kind " + std::to_string(kind) + " registered twice");
  }
}

const message_registry::entry* message_registry::find(msg_kind kind) const {
  auto it = entries_.find(kind);
  return it == entries_.end() ? nullptr : &it->second;
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
