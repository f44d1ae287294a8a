#pragma once
/// The message kinds a node understands, each with its strict body check.
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "runtime/message.hpp"

namespace ferry {

class message_registry {
 public:
  struct entry {
    std::string name;
    /// True when the body converts to the kind's struct (and passes its `valid()`, if it has one).
    std::function<bool(const msgpack::object&)> accepts;
  };

  /// Registers `M` under `M::kind`; registering another type under a used kind throws. A
  /// message with `bool valid() const` is accepted only when it holds.
  template <message M>
  void add(std::string_view name) {
    add_entry(M::kind, entry{std::string(name), [](const msgpack::object& body) {
                               try {
                                 const auto m = body.as<M>();
                                 if constexpr (requires { m.valid(); }) return m.valid();
                                 return true;
                               } catch (const std::exception&) {
                                 return false;
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

}  // namespace ferry
