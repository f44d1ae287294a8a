#pragma once
/// Who may hold a connection that has not proven the job secret yet. Every remote address gets a
/// bounded share of the budget, and a newcomer is let in by closing a connection that sits idle
/// (or has been handshaking for too long) rather than being refused behind it, so that whoever
/// floods a listener with idle connections keeps out only itself. The tcp transport's policy,
/// apart from its sockets.
#include <boost/asio/ip/address.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

namespace ferry {

struct handshake_limits {
  /// Connections in their handshake, all addresses together.
  std::size_t max_total = 32;
  /// Connections in their handshake from one address: well below `max_total`, so that no single
  /// address can take the whole budget.
  std::size_t max_per_address = 8;
  /// While a limit is reached, a connection still handshaking after this long may be closed to
  /// make room (a real peer finishes in milliseconds): the handshake deadline under pressure.
  std::chrono::milliseconds stale_after{1000};
};

/// Thread rules: owning loop only. Connections are named by ids the caller chooses.
class handshake_budget {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using address = boost::asio::ip::address;

  /// What to do with a new connection.
  struct verdict {
    bool admit = false;
    /// Close this connection first (and `remove` it): the room the newcomer takes.
    std::optional<std::uint64_t> evict;
    /// The limit that refused the newcomer or made room for it; empty when there was room.
    std::string_view limit;
  };

  explicit handshake_budget(handshake_limits limits) : limits_(limits) {}

  /// Judges a new connection from `from` at `now`. `spoke(id)` tells whether connection `id` has
  /// sent anything yet. When a limit is reached, room is made by closing the oldest connection
  /// that is idle (never spoke) or stale (`stale_after`): for `max_per_address` one of the same
  /// address, for `max_total` one of the address holding the most connections. With none to
  /// close, the newcomer is refused.
  verdict consider(const address& from, time_point now,
                   const std::function<bool(std::uint64_t)>& spoke) const;

  /// Counts connection `id` from `from` as handshaking since `now`.
  void add(std::uint64_t id, const address& from, time_point now);
  /// Connection `id` finished its handshake or closed; an unknown id is ignored.
  void remove(std::uint64_t id);
  void clear() { entries_.clear(); }

  std::size_t size() const { return entries_.size(); }
  std::size_t count(const address& from) const;
  const handshake_limits& limits() const { return limits_; }

 private:
  struct entry {
    std::uint64_t id;
    address from;
    time_point since;
  };

  handshake_limits limits_;
  std::vector<entry> entries_;  ///< oldest first
};

}  // namespace ferry
