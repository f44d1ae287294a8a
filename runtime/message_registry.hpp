#pragma once
/// The message kinds a node understands, each with its strict body check.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "runtime/message.hpp"

namespace ferry {

class message_registry {
 public:
  struct entry {
    std::string name;
    /// The body as the kind's struct (type-erased), or null when it does not convert or fails
    /// its `valid()`.
    std::function<std::shared_ptr<const void>(const msgpack::object&)> convert;
    bool accepts(const msgpack::object& body) const { return convert(body) != nullptr; }
  };

  /// Registers `M` under `M::kind`; registering another type under a used kind throws. A
  /// message with `bool valid() const` is accepted only when it holds.
  template <message M>
  void add(std::string_view name) {
    add_entry(M::kind, entry{std::string(name), [](const msgpack::object& body) -> std::shared_ptr<const void> {
                               try {
                                 auto m = std::make_shared<const M>(body.as<M>());
                                 if constexpr (requires { m->valid(); }) {
                                   if (!m->valid()) return nullptr;
                                 }
                                 return m;
                               } catch (const std::exception&) {
                                 return nullptr;
                               }
                             }});
  }

  const entry* find(msg_kind kind) const;
  std::size_t size() const { return entries_.size(); }

 private:
  void add_entry(msg_kind kind, entry e);
  std::map<msg_kind, entry> entries_;
};

/// Adds the runtime's own messages (ping, pong, ...).
void register_runtime_messages(message_registry& registry);
/// A registry of the runtime's own messages alone (for nodes that speak nothing else).
message_registry runtime_messages();

}  // namespace ferry
