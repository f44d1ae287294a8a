#pragma once
/// The message kinds a node understands, each with its strict body check.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/message.hpp"
#include "runtime/wire_reader.hpp"

namespace ferry {

class message_registry {
 public:
  struct entry {
    std::string name;
    /// The body as the kind's struct (type-erased), or null when it does not convert or fails
    /// its `valid()`.
    std::function<std::shared_ptr<const void>(const msgpack::object&)> convert;
    /// The same, read straight from bytes `detail::check_msgpack` accepted; the reader stands at
    /// the body.
    std::function<std::shared_ptr<const void>(detail::wire_reader&)> read;
    bool accepts(const msgpack::object& body) const { return convert(body) != nullptr; }
  };

  /// Registers `M` under `M::kind`; registering another type under a used kind throws. A
  /// message with `bool valid() const` is accepted only when it holds.
  template <message M>
  void add(std::string_view name) {
    add_entry(
        M::kind,
        entry{
            .name = std::string(name),
            .convert =
                [](const msgpack::object& body) {
                  return checked<M>([&](M& m) { body.convert(m); });
                },
            .read = [](detail::wire_reader& in) { return checked<M>([&](M& m) { in.read(m); }); }});
  }

  const entry* find(msg_kind kind) const;
  std::size_t size() const { return size_; }

 private:
  /// A new `M` filled by `fill`, or null when that throws or the result fails its `valid()`.
  template <message M, class Fill>
  static std::shared_ptr<const void> checked(Fill&& fill) {
    try {
      auto m = std::make_shared<M>();
      fill(*m);
      if constexpr (requires { m->valid(); }) {
        if (!m->valid()) return nullptr;
      }
      return m;
    } catch (const std::exception&) {
      return nullptr;
    }
  }
  void add_entry(msg_kind kind, entry e);
  std::vector<std::optional<entry>> by_kind_;  ///< indexed by kind: looked up for every frame
  std::size_t size_ = 0;
};

/// Adds the runtime's own messages (ping, pong, ...).
void register_runtime_messages(message_registry& registry);
/// A registry of the runtime's own messages alone (for nodes that speak nothing else).
message_registry runtime_messages();

}  // namespace ferry
