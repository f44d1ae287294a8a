#pragma once
/// One tcp link (internal to the tcp transport). Outgoing links carry our control frames and
/// writes to `peer_` and read its acks; incoming links read a peer's frames and writes and send
/// acks back. Every handler holds the link alive and returns at once when it was closed, so
/// nothing runs after `shut`. Its life and outgoing queue: tcp_link.cpp; its handshake:
/// tcp_link_handshake.cpp; what it reads once established: tcp_link_inbound.cpp.
#include <fmt/format.h>

#include <array>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "transport/errc.hpp"
#include "transport/tcp/link_protocol.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace ferry {

/// Lets one read or write system call move up to 4 MiB instead of Asio's default 64 KiB.
struct large_transfers {
  std::size_t operator()(const boost::system::error_code& ec, std::size_t) const {
    return ec ? 0 : std::size_t{4} << 20;
  }
};

/// The start of a lost link's detail when the stream ended inside a frame.
constexpr std::string_view mid_frame = "mid-frame: ";

/// The error a peer's REFUSE or WRITE_ACK names; anything we do not know is a protocol violation.
std::error_code refusal_error(std::uint16_t reason);
/// "address:port", "[v6]:port" for IPv6.
std::string endpoint_text(const asio::ip::tcp::endpoint& e);
/// Writes REFUSE without waiting: a best effort for connections closed at once.
void refuse_now(asio::ip::tcp::socket& socket, transport_errc reason);

class tcp_transport::link : public std::enable_shared_from_this<link> {
 public:
  enum class phase { connecting, handshaking, ready, closed };

  link(tcp_transport& owner, bool outgoing, asio::ip::tcp::socket socket, node_id peer)
      : owner_(&owner),
        io_(owner.loop_.io()),
        outgoing_(outgoing),
        socket_(std::move(socket)),
        timer_(owner.loop_.io()),
        peer_(peer) {}

  bool outgoing() const { return outgoing_; }
  node_id peer() const { return peer_; }
  bool ready() const { return phase_ == phase::ready; }
  bool handshaking() const { return phase_ == phase::handshaking; }
  bool closed() const { return phase_ == phase::closed; }
  bool refused_by_limit() const { return refused_by_limit_; }
  /// Incoming links: their id in the owner's handshake budget.
  std::uint64_t incoming_id() const { return incoming_id_; }
  /// Incoming links: whether the peer has sent its first frame, or has bytes waiting to be read.
  bool spoke() const;
  const std::string& remote() const { return remote_; }
  const asio::ip::address& remote_ip() const { return remote_ip_; }

  void start_client(const std::string& host, std::uint16_t port);
  void start_server(const asio::ip::tcp::endpoint& remote, std::uint64_t incoming_id);
  void enqueue_control(frame f, completion sent);

  void enqueue_write(const tcp_link::write_header& h, std::span<const std::byte> payload,
                     completion done);

  /// Same-host mode: the header alone; the peer copies the bytes out of our memory.
  void enqueue_local_write(const tcp_link::local_write_header& h, completion done);

  /// Closes a link in its handshake to make room for a newcomer: REFUSE(limit_exceeded) without
  /// waiting, then the owner drops it like any failed handshake, saying `detail`.
  void evict(std::string detail);

  /// Closes the link; everything pending completes with `why`, later, on the loop.
  void shut(std::error_code why);

 private:
  struct out_item {
    std::vector<std::byte> head;
    std::span<const std::byte> body;  ///< written after head without a copy
    frame keep;                       ///< owns `body` for control frames
    completion sent;                  ///< control frames: runs when the frame left
  };
  using frame_handler = std::function<void(tcp_link::frame_type, std::span<const std::byte>)>;

  tcp_transport& owner() { return *owner_; }
  tcp_link::auth_mode auth() const {
    return owner_->authenticated() ? tcp_link::auth_mode::hmac_sha256 : tcp_link::auth_mode::none;
  }

  void arm_timer();

  /// Asks the owner to drop this link (it calls `shut`) and report it.
  void drop(std::error_code why, std::string_view detail = {});
  void violation(std::string_view what);

  /// Sends REFUSE with `reason`, then drops the link.
  void refuse(transport_errc reason, std::string detail);
  void send_handshake(std::vector<std::byte> bytes, std::function<void()> then);
  void read_handshake(frame_handler next);

  // Client side of the handshake.

  void connected();
  void on_challenge(tcp_link::frame_type type, std::span<const std::byte> body);
  void on_accept(tcp_link::frame_type type, std::span<const std::byte> body);
  void on_refused(std::span<const std::byte> body);

  // Server side of the handshake.

  void on_hello(tcp_link::frame_type type, std::span<const std::byte> body);
  void on_proof(tcp_link::frame_type type, std::span<const std::byte> body);
  void became_ready();

  // Established links.

  void read_next();
  void on_head();
  void read_body(std::size_t n, void (*next)(link&));
  void on_control();
  void on_write_header();

  /// The payload read so far has ended: landed whole, refused, or cut short by the link's end.
  void end_payload();

  /// Reads a write's payload straight into its region (no staging copy), a piece at a time, the
  /// key checked again before each: once the region's owner retired the key (`rekey_region`, a
  /// new epoch), the rest is refused, so that an older epoch's write still arriving stops landing.
  void read_payload(const tcp_link::write_header& h, std::uint64_t landed);

  /// Drains the `left` payload bytes of a write the region check refused and acks it with why.
  void refuse_payload(const tcp_link::write_header& h, std::uint64_t left, std::error_code why);

  /// Same-host mode: checks the write like a WRITE, then has the copier pull its bytes out of the
  /// writer's memory while the link reads on; acks and reports the write once they landed.
  void on_local_write();
  void on_copied(const tcp_link::local_write_header& h, int error);

  /// Reads and discards `left` payload bytes of a refused write, a small buffer at a time.
  void drain(std::uint64_t left, std::function<void(link&)> then);
  void enqueue_ack(std::uint64_t id, std::uint16_t status);
  void on_write_ack();

  /// Writes queued frames, several per system call, payloads straight from the caller's memory.
  void flush();

  friend class tcp_transport;

  tcp_transport* owner_;  ///< null once closed
  asio::io_context& io_;
  bool outgoing_;
  asio::ip::tcp::socket socket_;
  asio::steady_timer timer_;
  std::unique_ptr<asio::ip::tcp::resolver> resolver_;
  node_id peer_;
  phase phase_ = phase::connecting;
  bool refused_by_limit_ = false;
  std::uint64_t incoming_id_ = 0;
  bool spoke_ = false;
  std::string remote_;
  asio::ip::address remote_ip_;
  std::string detail_;
  std::optional<client_handshake> client_;  ///< on links we open
  std::optional<server_handshake> server_;  ///< on links we accept
  std::array<std::byte, tcp_link::head_bytes> head_{};
  std::vector<std::byte> body_;
  std::vector<std::byte> scratch_;
  std::deque<out_item> queue_;
  std::vector<out_item> inflight_;
  bool writing_ = false;
  std::map<std::uint64_t, completion> pending_writes_;
  std::size_t copies_ = 0;  ///< same-host copies running for this incoming link
  /// The region of the WRITE whose payload this link is reading, under way in its table.
  std::optional<std::uint64_t> payload_region_;
  bool reading_paused_ = false;  ///< at `max_copies_per_link`: the next read waits for a copy
};

}  // namespace ferry
