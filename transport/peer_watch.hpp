#pragma once
/// Learns within milliseconds that a peer's process is gone, for a transport whose links have no
/// end to see (libfabric's RDM endpoints). Each node listens on a tcp port, and connects to the
/// port of every peer it links to; after a greeting that proves the job secret, the connection
/// carries nothing. When the peer's process dies its kernel closes the socket, and the end this
/// node reads is the peer's death. A peer cut off by the network sends no end: the heartbeat's
/// timeout still finds it.
///
/// Only the connecting side acts on an end (it chose the address it reached); the listening side
/// merely holds what it accepted, so a forged or replayed greeting can hold a socket open, never
/// report a death, nor close a connection held before it. Greetings must arrive within a second,
/// a few held connections per peer id; one that fails or is over that share is answered with a
/// refusal byte before the close, which the greeter does not take for a death.
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "runtime/event_loop.hpp"
#include "runtime/message.hpp"
#include "transport/link_auth.hpp"

namespace ferry {

/// Owning loop only.
class peer_watch : public std::enable_shared_from_this<peer_watch> {
 public:
  /// `on_gone(peer)`: the connection to a watched peer ended (or was refused).
  static std::shared_ptr<peer_watch> make(asio::io_context& io, node_id self, job_secret secret,
                                          std::function<void(node_id)> on_gone);
  /// Listens on `host`, an ephemeral port.
  std::error_code listen(const std::string& host);
  /// "host:port", what peers pass to `watch`.
  std::string address() const;
  /// Watches `peer` at `address`, instead of whatever was watched under its id before.
  void watch(node_id peer, std::string_view address);
  void forget(node_id peer);
  /// Closes every socket; no more calls of `on_gone`.
  void close();

  peer_watch(asio::io_context& io, node_id self, job_secret secret,
             std::function<void(node_id)> on_gone);

 private:
  struct watched;
  struct held;
  void accept();
  void greeted(const std::shared_ptr<held>& h);
  /// Keeps `h`, greeted by `from`, open until it ends or another greeting of `from` replaces it.
  void hold(node_id from, const std::shared_ptr<held>& h);
  void watch_until_end(node_id peer, const std::shared_ptr<watched>& w);
  void gone(node_id peer, const std::shared_ptr<watched>& w);
  /// `w` is what watches `peer` now (not one replaced or forgotten).
  bool watching(node_id peer, const std::shared_ptr<watched>& w) const;

  asio::io_context& io_;
  node_id self_;
  job_secret secret_;
  std::function<void(node_id)> on_gone_;
  asio::ip::tcp::acceptor acceptor_;
  std::map<node_id, std::shared_ptr<watched>> watched_;
  std::multimap<node_id, std::shared_ptr<held>> held_;  ///< accepted and greeted, by greeter id
  std::size_t greeting_ = 0;                            ///< accepted, not yet greeted
  bool closed_ = false;
};

}  // namespace ferry
