#pragma once
/// Transport over TCP sockets (Asio): authenticated links, control frames, and bulk writes read
/// by the receiver straight into the registered region. Link layer: docs/wire-format.md.
/// Same-host mode (scheme "cma"): the link stays, but a write's bytes skip the socket; the
/// receiver copies them out of the writer's memory (`process_copier`).
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "runtime/codec.hpp"
#include "runtime/event_loop.hpp"
#include "runtime/transport.hpp"
#include "transport/link_auth.hpp"
#include "transport/region_table.hpp"
#include "transport/tcp/handshake_budget.hpp"
#include "transport/tcp/process_copier.hpp"
#include "transport/tcp/refusal_report.hpp"

namespace ferry {

struct tcp_options {
  /// Address to listen on. Loopback unless the caller names another one on purpose.
  std::string bind_host = "127.0.0.1";
  /// Port to listen on; 0 takes a free one (see `local_address`).
  std::uint16_t port = 0;
  /// The job secret (`load_job_secret`); both ends of a link must hold the same one.
  job_secret secret;
  /// Without a secret, `start` fails unless this is set (tests, the demo).
  bool allow_unauthenticated = false;
  /// Connect + handshake must finish within this, or the link is dropped.
  std::chrono::milliseconds handshake_timeout{5000};
  /// Incoming connections that have not finished their handshake, all peers together.
  std::size_t max_unauthenticated = 32;
  /// Incoming connections from one remote IP address that have not finished their handshake: a
  /// share well below `max_unauthenticated`, so that one address cannot take the whole budget.
  std::size_t max_unauthenticated_per_address = 8;
  /// At either limit above, a newcomer is let in by closing the oldest connection that has sent
  /// nothing yet, or is still handshaking after this long (`handshake_budget`).
  std::chrono::milliseconds handshake_timeout_under_pressure{1000};
  /// Incoming connections from one remote IP address that have not proven the job secret (every
  /// link, when there is no secret). Proven links count against `max_links_per_node` only.
  std::size_t max_connections_per_address = 64;
  /// Authenticated incoming links of one node id (a reconnect may overlap its dead predecessor).
  std::size_t max_links_per_node = 4;
  /// `max_frame_bytes` caps control frames in both directions.
  codec_limits limits;
  /// Same-host mode (scheme "cma"): writes carry no payload; the receiver copies the bytes out of
  /// the writer's memory with process_vm_readv. Every node of the job must set it.
  bool same_host_copy = false;
  /// Same-host mode: threads that copy incoming writes; a write runs on up to this many at once.
  /// On the 4xH200 host process_vm_readv moved 38.6 GB/s on 8 threads, 43-50 GB/s on 16
  /// (bench/cma_peak); idle threads cost nothing.
  unsigned copy_threads = 16;
  /// Same-host mode: copies one incoming link may have running; at the limit the link stops
  /// reading until one finishes (the back-pressure a tcp write's payload gives by itself).
  std::size_t max_copies_per_link = 16;
};

/// Counters since `start`; owning loop only.
struct tcp_stats {
  std::uint64_t links_accepted = 0;       ///< incoming links that completed the handshake
  std::uint64_t connections_refused = 0;  ///< incoming connections refused by a limit
  std::uint64_t connections_evicted =
      0;  ///< connections closed before their handshake to make room for a newcomer
  std::uint64_t handshakes_failed =
      0;  ///< links of either side that did not complete the handshake
  std::uint64_t protocol_violations =
      0;                             ///< links dropped because the peer broke the link protocol
  std::uint64_t links_lost = 0;      ///< established links that broke (any reason but our close)
  std::uint64_t writes_refused = 0;  ///< incoming writes refused by the region check
  std::uint64_t copies_failed = 0;  ///< same-host writes that passed the check, then failed to copy
};

/// Create with `make`. Thread rules: owning loop only (like every transport).
/// Connection model: a node connects to a peer on its first send or write to it and carries all
/// its own frames and writes to that peer on this link; the peer acks writes on the same link.
/// After a loss the next send reconnects. In same-host mode the receiver acks a write once its
/// copy finished, so acks of one link may come back out of order.
class tcp_transport final : public transport, public std::enable_shared_from_this<tcp_transport> {
 public:
  static std::shared_ptr<tcp_transport> make(event_loop& loop, node_id self,
                                             tcp_options options = {});
  ~tcp_transport() override;

  std::string_view scheme() const override { return options_.same_host_copy ? "cma" : "tcp"; }
  /// "host:port" of the listening socket ("[v6]:port" for IPv6); empty before `start`.
  std::string local_address() const override;
  /// Errors: `transport_errc::unauthenticated` when no secret is set and unauthenticated mode
  /// was not asked for; `bad_address` or the socket's error when listening fails.
  /// Same-host mode: also lets any process of this user read ours (Yama's PR_SET_PTRACER).
  std::error_code start(transport_events events) override;
  /// Same-host mode: waits for the copies running into our regions (milliseconds); copies not
  /// started are dropped, so no byte lands after `close` returns.
  void close() override;
  std::error_code add_peer(node_id peer, std::string_view address) override;
  void remove_peer(node_id peer) override;
  void async_send(node_id to, frame f, completion done) override;
  result<region_desc> register_region(std::span<std::byte> memory) override;
  void deregister_region(std::uint64_t region_id) override;
  result<region_desc> rekey_region(std::uint64_t region_id) override;
  bool tracks_writes() const override { return true; }
  bool when_writes_end(std::uint64_t region_id, std::function<void()> done) override;
  void async_write(std::span<const std::byte> local, const region_desc& remote,
                   std::uint64_t offset, write_imm imm, completion done) override;

  const tcp_stats& stats() const { return stats_; }
  node_id self() const { return self_; }

 private:
  class link;
  friend class link;
  struct peer_entry {
    std::string host;
    std::uint16_t port = 0;
    std::shared_ptr<link> out;
  };

  tcp_transport(event_loop& loop, node_id self, tcp_options options);
  void accept_next();
  void on_accepted(boost::asio::ip::tcp::socket socket);
  /// The link carrying our frames to `peer`, connecting it if needed; null if unknown.
  std::shared_ptr<link> link_to(node_id peer);
  void on_link_ready(link& l);
  void on_link_lost(const std::shared_ptr<link>& l, std::error_code why);
  /// Drops the incoming links that are reading a WRITE's payload and that `which` picks.
  void drop_mid_payload(const std::function<bool(const link&)>& which, std::string_view why);
  /// Refuses a connection that has no link yet (REFUSE, then close), and counts it.
  void refuse_connection(boost::asio::ip::tcp::socket socket, const boost::asio::ip::address& from,
                         std::string_view limit);
  /// Counts a connection turned away before its handshake; logs a summary at most once a second.
  void turned_away(const boost::asio::ip::address& from, std::string reason);
  void arm_refusal_timer();
  void post_done(completion done, std::error_code ec);
  bool authenticated() const { return !options_.secret.empty(); }

  event_loop& loop_;
  node_id self_;
  tcp_options options_;
  transport_events events_;
  region_table regions_;
  std::optional<boost::asio::ip::tcp::acceptor> acceptor_;
  std::map<node_id, peer_entry> peers_;
  std::set<std::shared_ptr<link>> incoming_;
  /// Incoming links still in their handshake, by their id in `handshake_budget_`.
  std::map<std::uint64_t, link*> handshaking_;
  handshake_budget handshake_budget_;
  std::uint64_t next_incoming_id_ = 1;
  refusal_report refusals_;
  boost::asio::steady_timer refusal_timer_;
  bool refusal_timer_armed_ = false;
  /// Refused connections still waiting for their peer to read the REFUSE and close.
  std::shared_ptr<std::size_t> lingering_refusals_ = std::make_shared<std::size_t>(0);
  std::uint64_t next_write_id_ = 1;
  tcp_stats stats_;
  bool open_ = false;
  /// Same-host mode, while open: copies incoming writes.
  std::unique_ptr<process_copier> copier_;
  pid_t pid_ = 0;               ///< ours, named in our LOCAL_WRITE frames
  std::uint64_t host_tag_ = 0;  ///< `same_host_tag()`
};

/// The local address this host sends from to reach `address` ("host:port"): where a member
/// listens by default so that the coordinator's side of the network can reach it. Empty when
/// there is no route (or `address` is not host:port). Resolves a host name (blocking).
std::string local_host_toward(const std::string& address);

}  // namespace ferry
